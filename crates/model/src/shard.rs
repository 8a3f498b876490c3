//! The flat parameter shard (GUIDE "Parameter shard"): a stage's layers, exactly as it holds them
//! (int8 values and scales per output channel, or f32; norms and biases in f32), one after another
//! in one file, so a stage whose layers do not fit in memory streams them: a forward makes the
//! current and the next layer live, runs the current, and drops it — never more than two live.
//! Unpacking a layer copies the same int8 values and scales into the GEMM's packed layout, so the
//! products, and every bit after them, are those of the resident stage.
//!
//! File: `DAISYSHARD1`, the model fingerprint, the precision, the layer range, then per layer its
//! byte offset, length and SHA-256, then the layers. It is written whole to a temporary file and
//! renamed into place, and refused on open unless header, size and (on first use of each layer)
//! hash agree, so a file cut short by a crash is never read as a shard.

use std::io::Write;
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use sha2::{Digest, Sha256};

use crate::block::Block;
use crate::gemm::Precision;
use crate::{Error, Result};
use daisy_loader::ModelConfig;

const MAGIC: &[u8; 11] = b"DAISYSHARD1";
/// Layers of a streamed stage unpacked at once: the one running and the next.
pub const MAX_LIVE_LAYERS: usize = 2;

/// Appends little-endian values to a byte buffer.
pub(crate) struct Put<'a>(pub(crate) &'a mut Vec<u8>);

impl Put<'_> {
    pub(crate) fn u8(&mut self, v: u8) {
        self.0.push(v);
    }
    pub(crate) fn u64(&mut self, v: u64) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    pub(crate) fn f32s(&mut self, v: &[f32]) {
        self.u64(v.len() as u64);
        for x in v {
            self.0.extend_from_slice(&x.to_le_bytes());
        }
    }
    pub(crate) fn i8s(&mut self, v: &[i8]) {
        self.u64(v.len() as u64);
        self.0.extend(v.iter().map(|&x| x as u8));
    }
}

/// Reads what [`Put`] wrote; every read is checked against the end.
pub(crate) struct Take<'a> {
    bytes: &'a [u8],
    at: usize,
    what: &'a str,
}

impl<'a> Take<'a> {
    pub(crate) fn new(bytes: &'a [u8], what: &'a str) -> Self {
        Self { bytes, at: 0, what }
    }
    fn bytes(&mut self, n: usize) -> Result<&'a [u8]> {
        let end = self.at.checked_add(n).filter(|&e| e <= self.bytes.len());
        let Some(end) = end else {
            return Err(Error::Invalid(format!(
                "{}: cut short at byte {} (wanted {n} more of {})",
                self.what,
                self.at,
                self.bytes.len()
            )));
        };
        let out = &self.bytes[self.at..end];
        self.at = end;
        Ok(out)
    }
    pub(crate) fn u8(&mut self) -> Result<u8> {
        Ok(self.bytes(1)?[0])
    }
    pub(crate) fn u64(&mut self) -> Result<u64> {
        Ok(u64::from_le_bytes(
            self.bytes(8)?.try_into().expect("8 bytes"),
        ))
    }
    fn len(&mut self, width: usize) -> Result<usize> {
        let n = self.u64()?;
        usize::try_from(n)
            .ok()
            .filter(|n| {
                n.checked_mul(width)
                    .is_some_and(|b| b <= self.bytes.len() - self.at)
            })
            .ok_or_else(|| Error::Invalid(format!("{}: a length of {n} overruns it", self.what)))
    }
    pub(crate) fn f32s(&mut self) -> Result<Vec<f32>> {
        let n = self.len(4)?;
        Ok(self
            .bytes(n * 4)?
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().expect("4 bytes")))
            .collect())
    }
    pub(crate) fn i8s(&mut self) -> Result<Vec<i8>> {
        let n = self.len(1)?;
        Ok(self.bytes(n)?.iter().map(|&b| b as i8).collect())
    }
    pub(crate) fn done(&self) -> Result<()> {
        if self.at == self.bytes.len() {
            Ok(())
        } else {
            Err(Error::Invalid(format!(
                "{}: {} bytes left over",
                self.what,
                self.bytes.len() - self.at
            )))
        }
    }
}

/// What the header pins: a shard is only ever read as these layers of this model at this precision.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ShardKey {
    pub(crate) fingerprint: [u8; 32],
    pub(crate) precision: Precision,
    pub(crate) layers: Range<usize>,
}

fn precision_byte(p: Precision) -> u8 {
    match p {
        Precision::Int8 => 1,
        Precision::F32 => 0,
    }
}

/// Bytes of the header of a shard of `n` layers.
fn header_len(n: usize) -> usize {
    MAGIC.len() + 32 + 1 + 16 + n * 48
}

/// Writes a shard layer by layer (each layer can be dropped once written): the header's room
/// first, the layers, then the header, into a temporary file renamed into place.
pub(crate) struct ShardWriter {
    key: ShardKey,
    tmp: PathBuf,
    path: PathBuf,
    file: std::io::BufWriter<std::fs::File>,
    index: Vec<(u64, u64, [u8; 32])>,
    at: u64,
}

impl ShardWriter {
    pub(crate) fn create(path: &Path, key: ShardKey) -> Result<Self> {
        let io = |e: std::io::Error| Error::Invalid(format!("shard {}: {e}", path.display()));
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(io)?;
        }
        let tmp = path.with_extension(format!("shard.{}.tmp", std::process::id()));
        let mut file = std::io::BufWriter::new(std::fs::File::create(&tmp).map_err(io)?);
        file.write_all(&vec![0u8; header_len(key.layers.len())])
            .map_err(io)?;
        Ok(Self {
            key,
            tmp,
            path: path.to_path_buf(),
            file,
            index: Vec::new(),
            at: 0,
        })
    }

    pub(crate) fn push(&mut self, block: &Block) -> Result<()> {
        let mut bytes = Vec::new();
        block.write(&mut Put(&mut bytes));
        self.file
            .write_all(&bytes)
            .map_err(|e| Error::Invalid(format!("shard {}: {e}", self.tmp.display())))?;
        self.index
            .push((self.at, bytes.len() as u64, Sha256::digest(&bytes).into()));
        self.at += bytes.len() as u64;
        Ok(())
    }

    pub(crate) fn finish(self) -> Result<()> {
        let io = |e: std::io::Error| Error::Invalid(format!("shard {}: {e}", self.path.display()));
        let file = self
            .file
            .into_inner()
            .map_err(|e| Error::Invalid(format!("shard {}: {e}", self.path.display())))?;
        let mut header = Vec::new();
        header_into(&mut Put(&mut header), &self.key, &self.index);
        file.write_all_at(&header, 0).map_err(io)?;
        file.sync_all().map_err(io)?;
        std::fs::rename(&self.tmp, &self.path).map_err(io)
    }
}

fn header_into(put: &mut Put<'_>, key: &ShardKey, index: &[(u64, u64, [u8; 32])]) {
    put.0.extend_from_slice(MAGIC);
    put.0.extend_from_slice(&key.fingerprint);
    put.u8(precision_byte(key.precision));
    put.u64(key.layers.start as u64);
    put.u64(key.layers.end as u64);
    for (offset, len, sha) in index {
        put.u64(*offset);
        put.u64(*len);
        put.0.extend_from_slice(sha);
    }
}

/// Layers read from a shard file on demand, at most [`MAX_LIVE_LAYERS`] unpacked at once.
pub(crate) struct Streamed {
    path: PathBuf,
    file: std::fs::File,
    /// Where the layers start in the file.
    base: u64,
    /// The model index of local layer 0.
    first: usize,
    index: Vec<(u64, u64, [u8; 32])>,
    live: Mutex<Live<Block>>,
}

/// The unpacked layers of a streamed stage, by local index.
pub(crate) struct Live<T> {
    held: Vec<(usize, Arc<T>)>,
    /// Layers whose hash was checked in this process.
    checked: Vec<bool>,
}

impl<T> Live<T> {
    pub(crate) fn new(layers: usize) -> Self {
        Self {
            held: Vec::new(),
            checked: vec![false; layers],
        }
    }

    /// Layer `i`, unpacked by `unpack` (told whether to check its hash: the first time in this
    /// process) unless live already; a third live layer is refused.
    pub(crate) fn make_live(
        &mut self,
        i: usize,
        unpack: impl FnOnce(bool) -> Result<T>,
    ) -> Result<Arc<T>> {
        if let Some((_, b)) = self.held.iter().find(|(j, _)| *j == i) {
            return Ok(b.clone());
        }
        if self.held.len() >= MAX_LIVE_LAYERS {
            return Err(Error::Invalid(format!(
                "local layer {i}: a third live layer is refused (a streamed stage unpacks at most \
                 {MAX_LIVE_LAYERS}: layers {:?} are live)",
                self.held.iter().map(|(j, _)| *j).collect::<Vec<_>>()
            )));
        }
        let check = !self.checked.get(i).copied().unwrap_or(true);
        let block = Arc::new(unpack(check)?);
        if let Some(c) = self.checked.get_mut(i) {
            *c = true;
        }
        self.held.push((i, block.clone()));
        Ok(block)
    }

    pub(crate) fn drop_layer(&mut self, i: usize) {
        self.held.retain(|(j, _)| *j != i);
    }

    #[cfg(test)]
    pub(crate) fn count(&self) -> usize {
        self.held.len()
    }
}

impl Streamed {
    /// Open the shard at `path`, refused unless its header is `key`'s and its size is what the
    /// header says.
    pub(crate) fn open(path: &Path, key: &ShardKey) -> Result<Self> {
        let bad = |why: String| Error::Invalid(format!("shard {}: {why}", path.display()));
        let file = std::fs::File::open(path).map_err(|e| bad(e.to_string()))?;
        let size = file.metadata().map_err(|e| bad(e.to_string()))?.len();
        let n = key.layers.len();
        let header_len = header_len(n);
        let mut header = vec![0u8; header_len];
        file.read_exact_at(&mut header, 0)
            .map_err(|_| bad(format!("shorter than its header ({size} bytes)")))?;
        let mut take = Take::new(&header, "shard header");
        let magic = take.bytes(MAGIC.len())?;
        if magic != MAGIC {
            return Err(bad("not a shard file".into()));
        }
        let fingerprint = take.bytes(32)?;
        let precision = take.u8()?;
        let (start, end) = (take.u64()?, take.u64()?);
        if fingerprint != key.fingerprint
            || precision != precision_byte(key.precision)
            || (start, end) != (key.layers.start as u64, key.layers.end as u64)
        {
            return Err(bad(format!(
                "it holds layers {start}..{end} of another model or precision, not {:?} of this one",
                key.layers
            )));
        }
        let mut index = Vec::with_capacity(n);
        for _ in 0..n {
            let (offset, len) = (take.u64()?, take.u64()?);
            let sha: [u8; 32] = take.bytes(32)?.try_into().expect("32 bytes");
            index.push((offset, len, sha));
        }
        let layers_len: u64 = index.iter().map(|i| i.1).sum();
        let contiguous = index
            .iter()
            .scan(0u64, |at, &(o, l, _)| {
                let ok = o == *at;
                *at += l;
                Some(ok)
            })
            .all(|ok| ok);
        if !contiguous || size != header_len as u64 + layers_len {
            return Err(bad(format!(
                "{size} bytes where its header promises {} (cut short, or not written whole)",
                header_len as u64 + layers_len
            )));
        }
        Ok(Self {
            path: path.to_path_buf(),
            file,
            base: header_len as u64,
            first: key.layers.start,
            index,
            live: Mutex::new(Live::new(n)),
        })
    }

    /// Local layer `i` read and unpacked (its SHA-256 checked when `check`).
    pub(crate) fn unpack(
        &self,
        cfg: &ModelConfig,
        precision: Precision,
        i: usize,
        check: bool,
    ) -> Result<Block> {
        let (offset, len, sha) = self.index[i];
        let mut bytes = vec![0u8; len as usize];
        self.file
            .read_exact_at(&mut bytes, self.base + offset)
            .map_err(|e| Error::Invalid(format!("shard {}: {e}", self.path.display())))?;
        if check && <[u8; 32]>::from(Sha256::digest(&bytes)) != sha {
            return Err(Error::Invalid(format!(
                "shard {}: local layer {i} does not match its SHA-256 (the file changed)",
                self.path.display()
            )));
        }
        let block = Block::read(cfg, precision, &mut Take::new(&bytes, "a shard layer"))?;
        if block.index() != self.first + i {
            return Err(Error::Invalid(format!(
                "shard {}: local layer {i} is layer {} of the model, not {}",
                self.path.display(),
                block.index(),
                self.first + i
            )));
        }
        Ok(block)
    }

    pub(crate) fn live(&self) -> std::sync::MutexGuard<'_, Live<Block>> {
        self.live.lock().expect("live layers lock")
    }

    /// Bytes of the layers in the file.
    pub(crate) fn bytes(&self) -> usize {
        self.index.iter().map(|i| i.1 as usize).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn at_most_two_layers_are_live_and_a_third_is_refused() {
        let mut live: Live<usize> = Live::new(4);
        let mut unpacked = Vec::new();
        let mut get = |live: &mut Live<usize>, i: usize| {
            live.make_live(i, |check| {
                unpacked.push((i, check));
                Ok(i)
            })
        };
        assert_eq!(*get(&mut live, 0).unwrap(), 0);
        assert_eq!(*get(&mut live, 1).unwrap(), 1);
        assert_eq!(
            *get(&mut live, 0).unwrap(),
            0,
            "live already: not unpacked again"
        );
        let e = get(&mut live, 2).unwrap_err().to_string();
        assert!(e.contains("a third live layer is refused"), "{e}");
        live.drop_layer(0);
        assert_eq!(*get(&mut live, 2).unwrap(), 2);
        assert_eq!(live.count(), 2);
        live.drop_layer(1);
        live.drop_layer(2);
        assert_eq!(*get(&mut live, 0).unwrap(), 0);
        // Each layer's hash is checked the first time only.
        assert_eq!(unpacked, vec![(0, true), (1, true), (2, true), (0, false)]);
    }

    #[test]
    fn reads_refuse_what_overruns_or_is_left_over() {
        let mut bytes = Vec::new();
        let mut put = Put(&mut bytes);
        put.f32s(&[1.5, -0.0]);
        put.i8s(&[-127, 5]);
        let mut take = Take::new(&bytes, "a test");
        assert_eq!(
            take.f32s()
                .unwrap()
                .iter()
                .map(|v| v.to_bits())
                .collect::<Vec<_>>(),
            vec![1.5f32.to_bits(), (-0.0f32).to_bits()]
        );
        assert_eq!(take.i8s().unwrap(), vec![-127, 5]);
        take.done().unwrap();
        let cut = &bytes[..bytes.len() - 1];
        let mut take = Take::new(cut, "a test");
        take.f32s().unwrap();
        assert!(take.i8s().unwrap_err().to_string().contains("overruns"));
        let mut huge = Vec::new();
        Put(&mut huge).u64(u64::MAX);
        assert!(Take::new(&huge, "a test").f32s().is_err());
    }
}
