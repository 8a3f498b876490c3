//! A checkpoint: its typed config, its validated tensor index under canonical names, and reads of
//! one tensor at a time — from a Hugging Face-layout folder (single file or sharded safetensors),
//! a Hugging Face cache snapshot, or a GGUF file.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::Arc;

use sha2::{Digest, Sha256};

use crate::expected::{Found, canonical_name, expected_tensors, layer_prefix};
use crate::gguf::{self, GgmlType, GgufFile};
use crate::source::{LocalDir, Repo, find_in_cache, hf_cache_dir, parse_model_ref};
use crate::{
    ByteSource, DType, Error, FileSource, ModelConfig, check_finite, gguf_model, gguf_tokenizer,
    safetensors, widen,
};

/// Bytes of a tensor that [`Checkpoint::check_values`] reads at a time (a multiple of every
/// element size).
const CHECK_RUN: usize = 8 << 20;

/// The container the weights are stored in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    Safetensors,
    Gguf,
}

/// One tensor of a checkpoint, under its canonical name.
#[derive(Clone, Debug)]
pub struct TensorInfo {
    /// Canonical name (Hugging Face Llama names; GPT-2 names without `transformer.`).
    pub name: String,
    /// The name as stored in the file.
    pub stored_name: String,
    /// The dtype [`Checkpoint::read_raw`] returns: the stored dtype for safetensors; for GGUF the
    /// stored float type, or F32 for quantized types (dequantized on read).
    pub dtype: DType,
    /// The GGUF storage type, for GGUF checkpoints.
    pub gguf_type: Option<GgmlType>,
    /// Row-major shape.
    pub shape: Vec<usize>,
    /// Bytes as stored.
    pub byte_len: u64,
    /// Index of the file holding it (see [`Checkpoint::files`]).
    pub shard: usize,
    /// Absolute byte offset in that file.
    pub offset: u64,
    /// The decoder layer it belongs to, if any.
    pub layer: Option<usize>,
    /// GGUF Q/K rows to un-permute with this many heads.
    unpermute_heads: Option<usize>,
}

impl TensorInfo {
    pub fn elements(&self) -> usize {
        self.shape.iter().product()
    }
}

enum Kind {
    Hf { repo: Box<dyn Repo> },
    Gguf { file: Box<GgufFile> },
}

/// An opened, validated checkpoint.
pub struct Checkpoint {
    config: ModelConfig,
    tensors: Vec<TensorInfo>,
    by_name: HashMap<String, usize>,
    files: Vec<(String, Arc<dyn ByteSource>)>,
    kind: Kind,
    fingerprint: [u8; 32],
    repo_id: String,
    commit: String,
    description: String,
}

/// Length-prefixed SHA-256 input: each part is its u64 little-endian length, then its bytes.
fn hash_parts<'a>(parts: impl IntoIterator<Item = &'a [u8]>) -> [u8; 32] {
    let mut h = Sha256::new();
    for part in parts {
        h.update((part.len() as u64).to_le_bytes());
        h.update(part);
    }
    h.finalize().into()
}

fn read_all(src: &dyn ByteSource) -> Result<Vec<u8>, Error> {
    let len = src.len()?;
    let len = usize::try_from(len).map_err(|_| Error::OutOfRange {
        what: src.describe(),
        offset: 0,
        len,
        size: len,
    })?;
    src.read_at(0, len)
}

impl Checkpoint {
    /// Open `model`: an existing local path wins (a Hugging Face-layout folder or a `.gguf` file);
    /// otherwise a repo id `org/name[@revision]` looked up in the Hugging Face cache, then (with the
    /// `hub` feature) fetched from `$HF_ENDPOINT`.
    pub fn open(model: &str) -> Result<Checkpoint, Error> {
        #[cfg(feature = "hub")]
        return Checkpoint::open_with(model, None);
        #[cfg(not(feature = "hub"))]
        return Checkpoint::open_local(model);
    }

    /// Open `model` from a local path or the Hugging Face cache only; `Ok(Err(repo))` hands back the
    /// parsed repo reference when it is in neither.
    fn open_offline(model: &str) -> Result<Result<Checkpoint, daisy_wire::ModelRef>, Error> {
        let path = Path::new(model);
        if path.is_file() {
            let src: Arc<dyn ByteSource> = Arc::new(FileSource::open(path)?);
            return Checkpoint::from_gguf(src, "", "").map(Ok);
        }
        if path.is_dir() {
            return Checkpoint::from_repo(Box::new(LocalDir::new(path)), "", "").map(Ok);
        }
        let repo = parse_model_ref(model)?;
        let Some(cache) = hf_cache_dir() else {
            return Ok(Err(repo));
        };
        match find_in_cache(&cache, &repo) {
            Ok(snapshot) => Checkpoint::from_repo(
                Box::new(LocalDir::new(&snapshot.dir)),
                repo.repo.as_str(),
                &snapshot.commit,
            )
            .map(Ok),
            Err(Error::NotFound(_)) => Ok(Err(repo)),
            Err(e) => Err(e),
        }
    }

    /// [`Checkpoint::open`] without the Hub: a local path or the Hugging Face cache.
    pub fn open_local(model: &str) -> Result<Checkpoint, Error> {
        match Checkpoint::open_offline(model)? {
            Ok(checkpoint) => Ok(checkpoint),
            Err(_) => Err(Error::NotFound(format!(
                "no local path `{model}` exists, and it is not in the Hugging Face cache{}; this \
                 build fetches nothing from the Hub",
                hf_cache_dir().map_or(String::new(), |c| format!(" at {}", c.display()))
            ))),
        }
    }

    /// [`Checkpoint::open`], fetching a repo that is neither local nor cached through `hub` (a client
    /// for `$HF_ENDPOINT` is made when `None`).
    #[cfg(feature = "hub")]
    pub fn open_with(
        model: &str,
        hub: Option<Arc<crate::hub::HubClient>>,
    ) -> Result<Checkpoint, Error> {
        let repo = match Checkpoint::open_offline(model)? {
            Ok(checkpoint) => return Ok(checkpoint),
            Err(repo) => repo,
        };
        let hub = match hub {
            Some(hub) => hub,
            None => Arc::new(crate::hub::HubClient::from_env()?),
        };
        let endpoint = hub.endpoint().to_string();
        Checkpoint::from_hub_ref(hub, repo).map_err(|e| match e {
            // A mistyped local path looks like a repo id: say both what was looked for and where.
            Error::Http { .. } => Error::NotFound(format!(
                "no local path `{model}` exists, it is not in the Hugging Face cache, and fetching \
                 it as a repo id from {endpoint} failed: {e}"
            )),
            e => e,
        })
    }

    /// Open the repo id `org/name[@revision]` on the Hub (or a mirror) through `client`, fetching
    /// only the small files and each safetensors header; tensor bytes are fetched when read.
    #[cfg(feature = "hub")]
    pub fn from_hub(client: Arc<crate::hub::HubClient>, model: &str) -> Result<Checkpoint, Error> {
        Checkpoint::from_hub_ref(client, parse_model_ref(model)?)
    }

    #[cfg(feature = "hub")]
    fn from_hub_ref(
        client: Arc<crate::hub::HubClient>,
        model: daisy_wire::ModelRef,
    ) -> Result<Checkpoint, Error> {
        let repo_id = model.repo.to_string();
        let hub = crate::hub::HubRepo::new(client, model);
        let commit = hub.resolve()?;
        Checkpoint::from_repo(Box::new(hub), &repo_id, &commit)
    }

    /// Open a Hugging Face-layout repository: `config.json` and `model.safetensors` or
    /// `model.safetensors.index.json` with its shards. `repo_id` and `commit` enter the
    /// fingerprint (empty for a local folder).
    pub fn from_repo(
        repo: Box<dyn Repo>,
        repo_id: &str,
        commit: &str,
    ) -> Result<Checkpoint, Error> {
        let desc = repo.describe();
        let config_src = repo
            .open("config.json")?
            .ok_or_else(|| Error::NotFound(format!("{desc}: no config.json")))?;
        let config_bytes = read_all(config_src.as_ref())?;
        let config = ModelConfig::from_json(&config_src.describe(), &config_bytes)?;

        let (shard_names, weight_map) = match repo.open("model.safetensors.index.json")? {
            Some(index) => read_index(index.as_ref())?,
            None => (vec!["model.safetensors".to_string()], None),
        };
        let mut files = Vec::new();
        let mut headers = Vec::new();
        for name in &shard_names {
            let src = repo.open(name)?.ok_or_else(|| {
                let hint = if name == "model.safetensors"
                    && repo.open("pytorch_model.bin").ok().flatten().is_some()
                {
                    " (pytorch_model.bin is not supported; safetensors weights are needed)"
                } else {
                    ""
                };
                Error::NotFound(format!("{desc}: no {name}{hint}"))
            })?;
            headers.push(safetensors::read_header(src.as_ref())?);
            files.push((name.clone(), src));
        }

        let mut tensors = Vec::new();
        let mut problems = Vec::new();
        let mut where_found: HashMap<String, usize> = HashMap::new();
        for (shard, header) in headers.iter().enumerate() {
            for t in &header.tensors {
                if let Some(map) = &weight_map
                    && map.get(&t.name) != Some(&shard_names[shard])
                {
                    problems.push(Error::Safetensors {
                        file: files[shard].1.describe(),
                        problem: format!(
                            "tensor `{}` is not listed for this shard in model.safetensors.index.json",
                            t.name
                        ),
                    });
                    continue;
                }
                let Found::Tensor(name) = canonical_name(&config, &t.name) else {
                    continue;
                };
                if let Some(&first) = where_found.get(&name) {
                    problems.push(Error::DuplicateTensor {
                        tensor: name,
                        first: shard_names[first].clone(),
                        second: shard_names[shard].clone(),
                    });
                    continue;
                }
                where_found.insert(name.clone(), shard);
                tensors.push(TensorInfo {
                    layer: layer_of(&config, &name),
                    name,
                    stored_name: t.name.clone(),
                    dtype: t.dtype,
                    gguf_type: None,
                    shape: t.shape.clone(),
                    byte_len: t.byte_len,
                    shard,
                    offset: t.offset,
                    unpermute_heads: None,
                });
            }
        }
        if let Some(map) = &weight_map {
            for (name, shard) in map {
                let listed = shard_names
                    .iter()
                    .position(|s| s == shard)
                    .expect("from the map");
                if !headers[listed].tensors.iter().any(|t| &t.name == name) {
                    problems.push(Error::Safetensors {
                        file: files[listed].1.describe(),
                        problem: format!(
                            "model.safetensors.index.json lists tensor `{name}` here but the shard has no such tensor"
                        ),
                    });
                }
            }
        }
        Error::from_list(problems)?;
        check_tensor_set(&config, &tensors)?;

        let mut parts: Vec<&[u8]> = vec![repo_id.as_bytes(), commit.as_bytes(), &config_bytes];
        parts.extend(headers.iter().map(|h| h.header_bytes.as_slice()));
        let fingerprint = hash_parts(parts);
        Ok(Checkpoint::assemble(
            config,
            tensors,
            files,
            Kind::Hf { repo },
            fingerprint,
            repo_id,
            commit,
            desc,
        ))
    }

    /// Open a GGUF file (architectures `llama` and `qwen2`).
    pub fn from_gguf(
        src: Arc<dyn ByteSource>,
        repo_id: &str,
        commit: &str,
    ) -> Result<Checkpoint, Error> {
        let desc = src.describe();
        let file = gguf::read_gguf(src.as_ref())?;
        let config = gguf_model::config_from_gguf(&desc, &file)?;
        let undo_permute = config.model_type == "llama";
        let mut tensors = Vec::new();
        let mut problems = Vec::new();
        for t in &file.tensors {
            let Some(name) = gguf_model::canonical_name(&t.name) else {
                problems.push(Error::UnexpectedTensor(t.name.clone()));
                continue;
            };
            let dtype = match t.ggml_type {
                GgmlType::F16 => DType::F16,
                GgmlType::BF16 => DType::BF16,
                GgmlType::F32 | GgmlType::Q8_0 | GgmlType::Q4_0 | GgmlType::Q4_1 => DType::F32,
                GgmlType::Other(_) => {
                    problems.push(Error::UnsupportedGgmlType {
                        file: desc.clone(),
                        tensor: t.name.clone(),
                        ggml_type: t.ggml_type.name(),
                    });
                    continue;
                }
            };
            let unpermute_heads = if !undo_permute {
                None
            } else if name.contains(".self_attn.q_proj.") {
                Some(config.num_heads)
            } else if name.contains(".self_attn.k_proj.") {
                Some(config.num_kv_heads)
            } else {
                None
            };
            tensors.push(TensorInfo {
                layer: layer_of(&config, &name),
                name,
                stored_name: t.name.clone(),
                dtype,
                gguf_type: Some(t.ggml_type),
                shape: t.shape(),
                byte_len: t.byte_len,
                shard: 0,
                offset: t.offset,
                unpermute_heads,
            });
        }
        Error::from_list(problems)?;
        check_tensor_set(&config, &tensors)?;
        let header = src.read_at(0, file.header_len as usize)?;
        let fingerprint = hash_parts([repo_id.as_bytes(), commit.as_bytes(), header.as_slice()]);
        let files = vec![(desc.clone(), src)];
        let kind = Kind::Gguf {
            file: Box::new(file),
        };
        Ok(Checkpoint::assemble(
            config,
            tensors,
            files,
            kind,
            fingerprint,
            repo_id,
            commit,
            desc,
        ))
    }

    #[allow(clippy::too_many_arguments)]
    fn assemble(
        config: ModelConfig,
        tensors: Vec<TensorInfo>,
        files: Vec<(String, Arc<dyn ByteSource>)>,
        kind: Kind,
        fingerprint: [u8; 32],
        repo_id: &str,
        commit: &str,
        description: String,
    ) -> Checkpoint {
        let by_name = tensors
            .iter()
            .enumerate()
            .map(|(i, t)| (t.name.clone(), i))
            .collect();
        Checkpoint {
            config,
            tensors,
            by_name,
            files,
            kind,
            fingerprint,
            repo_id: repo_id.to_string(),
            commit: commit.to_string(),
            description,
        }
    }

    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    pub fn format(&self) -> Format {
        match self.kind {
            Kind::Hf { .. } => Format::Safetensors,
            Kind::Gguf { .. } => Format::Gguf,
        }
    }

    /// The folder or file the checkpoint was opened from.
    pub fn describe(&self) -> &str {
        &self.description
    }

    /// The repo id (empty for a local path).
    pub fn repo_id(&self) -> &str {
        &self.repo_id
    }

    /// The resolved commit (empty for a local path).
    pub fn commit(&self) -> &str {
        &self.commit
    }

    /// The files holding tensors, by [`TensorInfo::shard`] index.
    pub fn files(&self) -> Vec<&str> {
        self.files.iter().map(|(n, _)| n.as_str()).collect()
    }

    /// The GGUF metadata, for GGUF checkpoints.
    pub fn gguf_metadata(&self) -> Option<&BTreeMap<String, gguf::Value>> {
        match &self.kind {
            Kind::Gguf { file } => Some(&file.metadata),
            Kind::Hf { .. } => None,
        }
    }

    /// Every tensor under its canonical name, in file order.
    pub fn tensors(&self) -> impl Iterator<Item = &TensorInfo> {
        self.tensors.iter()
    }

    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.by_name.get(name).map(|&i| &self.tensors[i])
    }

    /// The tensors of decoder layer `layer`.
    pub fn layer_tensors(&self, layer: usize) -> Vec<&TensorInfo> {
        self.tensors
            .iter()
            .filter(|t| t.layer == Some(layer))
            .collect()
    }

    /// The tensors outside every decoder layer (embeddings, final norm, lm_head).
    pub fn non_layer_tensors(&self) -> Vec<&TensorInfo> {
        self.tensors.iter().filter(|t| t.layer.is_none()).collect()
    }

    /// SHA-256 over the length-prefixed repo id, resolved commit, `config.json` bytes and every
    /// safetensors JSON header in shard order (DESIGN §4); for GGUF, over the repo id, commit and
    /// the file's bytes up to the end of the tensor infos (header, metadata, tensor infos).
    pub fn fingerprint(&self) -> [u8; 32] {
        self.fingerprint
    }

    fn info(&self, name: &str) -> Result<&TensorInfo, Error> {
        self.tensor(name)
            .ok_or_else(|| Error::NoSuchTensor(name.to_string()))
    }

    /// The tensor's bytes: as stored for safetensors; for GGUF, stored float bytes or the
    /// dequantized f32 values, with llama.cpp's Q/K row permutation undone.
    /// Announce the tensors about to be read, in the order they will be read: a remote source
    /// fetches them ahead in that order, adjacent tensors coalesced into one range, one range in
    /// flight while the previous one is used.
    pub fn prefetch(&self, names: &[&str]) {
        let mut per_shard: HashMap<usize, Vec<(u64, u64)>> = HashMap::new();
        for info in names.iter().filter_map(|n| self.tensor(n)) {
            per_shard
                .entry(info.shard)
                .or_default()
                .push((info.offset, info.byte_len));
        }
        for (shard, ranges) in per_shard {
            self.files[shard].1.prefetch(&ranges);
        }
    }

    /// The stored bytes of `name` memory-mapped, where its file is local and they are the tensor
    /// as stored (a safetensors tensor, or a GGUF F32/F16/BF16 one that needs no reordering);
    /// `None` otherwise (read it with [`Self::read_raw`]).
    pub fn map_raw(&self, name: &str) -> Result<Option<(DType, crate::MappedBytes)>, Error> {
        let info = self.info(name)?;
        let as_stored = match info.gguf_type {
            None => true,
            Some(GgmlType::F16 | GgmlType::BF16 | GgmlType::F32) => info.unpermute_heads.is_none(),
            Some(_) => false,
        };
        if !as_stored {
            return Ok(None);
        }
        let src = &self.files[info.shard].1;
        src.map(info.offset, info.byte_len as usize)
            .transpose()
            .map(|m| m.map(|m| (info.dtype, m)))
    }

    pub fn read_raw(&self, name: &str) -> Result<(DType, Vec<u8>), Error> {
        let info = self.info(name)?;
        let src = &self.files[info.shard].1;
        let bytes = src.read_at(info.offset, info.byte_len as usize)?;
        let Some(ty) = info.gguf_type else {
            return Ok((info.dtype, bytes));
        };
        let row_len = if info.shape.len() >= 2 {
            info.shape[1..].iter().product()
        } else {
            1
        };
        match ty {
            GgmlType::F16 | GgmlType::BF16 | GgmlType::F32 => {
                let bytes = match info.unpermute_heads {
                    Some(heads) => gguf::unpermute_rows(&bytes, heads, row_len * info.dtype.size()),
                    None => bytes,
                };
                Ok((info.dtype, bytes))
            }
            _ => {
                let values = self.dequantized(info, &bytes)?;
                Ok((
                    DType::F32,
                    values.iter().flat_map(|v| v.to_le_bytes()).collect(),
                ))
            }
        }
    }

    fn dequantized(&self, info: &TensorInfo, bytes: &[u8]) -> Result<Vec<f32>, Error> {
        let ty = info.gguf_type.expect("gguf tensor");
        let values = gguf::dequantize(&info.stored_name, ty, bytes).map_err(|e| match e {
            Error::Gguf { problem, .. } => Error::Gguf {
                file: self.description.clone(),
                problem,
            },
            other => other,
        })?;
        let row_len = if info.shape.len() >= 2 {
            info.shape[1..].iter().product()
        } else {
            1
        };
        Ok(match info.unpermute_heads {
            Some(heads) => gguf::unpermute_rows(&values, heads, row_len),
            None => values,
        })
    }

    /// The tensor widened (or dequantized) to f32, exactly; a non-finite value is refused, naming
    /// the tensor.
    pub fn read_f32(&self, name: &str) -> Result<Vec<f32>, Error> {
        let (dtype, bytes) = self.read_raw(name)?;
        let values = widen(dtype, &bytes);
        check_finite(name, &values)?;
        Ok(values)
    }

    /// GGUF only: the tensor's values exactly as `gguf.quants.dequantize` gives them, in file
    /// order, before the Q/K un-permutation (the form the independent golden hashes).
    pub fn read_gguf_dequantized(&self, name: &str) -> Result<Vec<f32>, Error> {
        let info = self.info(name)?;
        let Some(ty) = info.gguf_type else {
            return Err(Error::NoSuchTensor(format!("{name} (not a gguf tensor)")));
        };
        let bytes = self.files[info.shard]
            .1
            .read_at(info.offset, info.byte_len as usize)?;
        gguf::dequantize(&info.stored_name, ty, &bytes)
    }

    /// Read every tensor and refuse non-finite values, reporting every offending tensor.
    ///
    /// Float tensors are checked on their stored bits, [`CHECK_RUN`] bytes at a time, so no tensor
    /// is held whole, nor widened (a small model's tied embedding is most of its bytes); one with a
    /// non-finite value is then read whole for the error that names it. Quantized GGUF tensors are
    /// dequantized.
    pub fn check_values(&self) -> Result<(), Error> {
        let mut problems = Vec::new();
        for t in &self.tensors {
            let plain = matches!(
                t.gguf_type,
                None | Some(GgmlType::F16 | GgmlType::BF16 | GgmlType::F32)
            );
            let checked = if plain {
                self.stored_bits_finite(t)
            } else {
                Ok(false)
            };
            let result = match checked {
                Ok(true) => Ok(()),
                Ok(false) => self.read_f32(&t.name).map(drop),
                Err(e) => Err(e),
            };
            if let Err(e) = result {
                problems.push(e);
            }
        }
        Error::from_list(problems)
    }

    /// Whether every stored value of a float tensor is finite, read a run at a time.
    fn stored_bits_finite(&self, info: &TensorInfo) -> Result<bool, Error> {
        let src = &self.files[info.shard].1;
        let total = info.byte_len as usize;
        let mut done = 0;
        while done < total {
            let len = CHECK_RUN.min(total - done);
            let bytes = src.read_at(info.offset + done as u64, len)?;
            if !crate::dtype::all_finite(info.dtype, &bytes) {
                return Ok(false);
            }
            done += len;
        }
        Ok(true)
    }

    /// `tokenizer.json`: the file, or for GGUF one synthesized from `tokenizer.ggml.*`.
    pub fn tokenizer_json(&self) -> Result<Vec<u8>, Error> {
        match &self.kind {
            Kind::Hf { repo } => {
                let src = repo.open("tokenizer.json")?.ok_or_else(|| {
                    Error::NotFound(format!("{}: no tokenizer.json", repo.describe()))
                })?;
                read_all(src.as_ref())
            }
            Kind::Gguf { file } => gguf_tokenizer::tokenizer_json(file),
        }
    }

    /// `tokenizer_config.json` when present; for GGUF, the chat template and special tokens.
    pub fn tokenizer_config_json(&self) -> Result<Option<Vec<u8>>, Error> {
        match &self.kind {
            Kind::Hf { repo } => match repo.open("tokenizer_config.json")? {
                Some(src) => read_all(src.as_ref()).map(Some),
                None => Ok(None),
            },
            Kind::Gguf { file } => gguf_tokenizer::tokenizer_config_json(file),
        }
    }
}

fn layer_of(cfg: &ModelConfig, name: &str) -> Option<usize> {
    let probe = layer_prefix(cfg, 0);
    let stem = probe
        .strip_suffix("0.")
        .expect("prefix ends with the layer");
    let rest = name.strip_prefix(stem)?;
    let (n, _) = rest.split_once('.')?;
    n.parse().ok()
}

/// `model.safetensors.index.json` → (shard file names in sorted order, tensor → shard).
/// Shard file names, sorted, and the tensor → shard map.
type Index = (Vec<String>, Option<BTreeMap<String, String>>);

fn read_index(src: &dyn ByteSource) -> Result<Index, Error> {
    let file = src.describe();
    let bad = |problem: String| Error::Safetensors {
        file: file.clone(),
        problem,
    };
    let bytes = read_all(src)?;
    let root: serde_json::Value =
        serde_json::from_slice(&bytes).map_err(|e| bad(format!("not JSON: {e}")))?;
    let map = root
        .get("weight_map")
        .and_then(serde_json::Value::as_object)
        .ok_or_else(|| bad("no `weight_map` object".into()))?;
    let mut weight_map = BTreeMap::new();
    for (name, shard) in map {
        let shard = shard
            .as_str()
            .ok_or_else(|| bad(format!("weight_map entry `{name}` is not a file name")))?;
        if shard.is_empty()
            || shard.contains("..")
            || shard.starts_with('/')
            || !shard.ends_with(".safetensors")
        {
            return Err(bad(format!(
                "weight_map entry `{name}` names shard `{shard}`, expected a .safetensors file in the folder"
            )));
        }
        weight_map.insert(name.clone(), shard.to_string());
    }
    let mut shards: Vec<String> = weight_map.values().cloned().collect();
    shards.sort();
    shards.dedup();
    if shards.is_empty() {
        return Err(bad("`weight_map` is empty".into()));
    }
    Ok((shards, Some(weight_map)))
}

/// Every expected tensor present with its expected shape, and nothing else.
fn check_tensor_set(cfg: &ModelConfig, tensors: &[TensorInfo]) -> Result<(), Error> {
    let expected = expected_tensors(cfg);
    let found: HashMap<&str, &TensorInfo> = tensors.iter().map(|t| (t.name.as_str(), t)).collect();
    let mut problems = Vec::new();
    for (name, shape) in &expected {
        match found.get(name.as_str()) {
            None => problems.push(Error::MissingTensor(name.clone())),
            Some(t) if &t.shape != shape => problems.push(Error::ShapeMismatch {
                tensor: name.clone(),
                found: t.shape.clone(),
                expected: shape.clone(),
            }),
            Some(_) => {}
        }
    }
    let wanted: std::collections::HashSet<&str> =
        expected.iter().map(|(n, _)| n.as_str()).collect();
    for t in tensors {
        if !wanted.contains(t.name.as_str()) {
            problems.push(Error::UnexpectedTensor(t.stored_name.clone()));
        }
    }
    Error::from_list(problems)
}
