//! The flat parameter shard (GUIDE "Parameter shard"): a stage's layers, exactly as it holds them
//! (int8 values and scales per output channel, or f32; norms and biases in f32), one after another
//! in one file, so a stage whose layers do not fit in memory streams them: a forward makes the
//! current and the next layer live, runs the current, and drops it — never more than two live.
//! Unpacking a layer copies the same int8 values and scales into the GEMM's packed layout, so the
//! products, and every bit after them, are those of the resident stage.
//!
//! A resident stage writes the same file after its first load and, on the next start, maps it and
//! borrows its int8 arrays in place: no layer is fetched, widened or quantized again.
//!
//! File (little-endian): `DAISYSHARD2`, the model fingerprint, the precision, the layer range, then
//! per layer its byte offset (from the end of the header), length and SHA-256, zeros up to a
//! multiple of 64, then the layers, each starting at a multiple of 64. An int8 weight's arrays are
//! those of [`PackedWeights`] as the GEMM reads them (lines, tail, corrections, scales), each its
//! length then zeros up to its alignment then its bytes, so a mapped file is used where it lies.
//! It is written whole to a temporary file and renamed into place, and refused on open unless
//! header and size agree, and on first use of each layer unless its hash agrees (a resident stage
//! hashes every layer as it loads, a streamed one each layer the first time it reads it), so a
//! file cut short by a crash or changed on disk is never read as a shard.

use std::io::Write;
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use daisy_gemm_int8::{HugeBytes, PackedWeights, SharedBytes};
use sha2::{Digest, Sha256};

use crate::block::Block;
use crate::gemm::Precision;
use crate::{Error, Result};
use daisy_loader::ModelConfig;

const MAGIC: &[u8; 11] = b"DAISYSHARD2";
/// Where each layer (and the first, after the header) starts: a multiple of this.
const LAYER_ALIGN: u64 = 64;
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
    /// An int8 weight's arrays, each aligned (the buffer starts at a multiple of 64).
    pub(crate) fn packed(&mut self, w: &PackedWeights) {
        for (bytes, align) in w.parts().arrays {
            self.u64(bytes.len() as u64);
            self.pad(align);
            self.0.extend_from_slice(bytes);
        }
    }
    fn pad(&mut self, align: usize) {
        let len = self.0.len().next_multiple_of(align);
        self.0.resize(len, 0);
    }
}

/// Reads what [`Put`] wrote; every read is checked against the end.
pub(crate) struct Take<'a> {
    bytes: &'a [u8],
    at: usize,
    what: &'a str,
    /// What `bytes` lies in, and where: int8 arrays are borrowed from it, not copied.
    shared: Option<(&'a SharedBytes, usize)>,
}

impl<'a> Take<'a> {
    pub(crate) fn new(bytes: &'a [u8], what: &'a str) -> Self {
        Self {
            bytes,
            at: 0,
            what,
            shared: None,
        }
    }

    /// Bytes `range` of `shared`, whose int8 arrays [`Take::packed`] borrows.
    pub(crate) fn shared(shared: &'a SharedBytes, range: Range<usize>, what: &'a str) -> Self {
        let all = AsRef::<[u8]>::as_ref(&**shared);
        Self {
            bytes: &all[range.clone()],
            at: 0,
            what,
            shared: Some((shared, range.start)),
        }
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
    /// What [`Put::packed`] wrote, as an `n × k` weight borrowing its arrays.
    pub(crate) fn packed(&mut self, n: usize, k: usize) -> Result<PackedWeights> {
        let Some((shared, base)) = self.shared else {
            return Err(Error::Invalid(format!(
                "{}: int8 arrays read outside a shard",
                self.what
            )));
        };
        let mut ranges: [Range<usize>; 4] = Default::default();
        for (range, align) in ranges.iter_mut().zip([64, 1, 4, 4]) {
            let len = self.len(1)?;
            let start = (base + self.at).next_multiple_of(align) - base;
            self.bytes(start - self.at)?;
            self.bytes(len)?;
            *range = base + start..base + start + len;
        }
        PackedWeights::from_shared(n, k, shared, ranges)
            .map_err(|e| Error::Invalid(format!("{}: a {n}x{k} weight: {e}", self.what)))
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
        Precision::Int8x2 => 2,
    }
}

/// Bytes of the header of a shard of `n` layers, padding included: where its layers begin.
fn header_len(n: usize) -> usize {
    (MAGIC.len() + 32 + 1 + 16 + n * 48).next_multiple_of(LAYER_ALIGN as usize)
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
        sweep_orphans(path);
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
        let io = |e: std::io::Error| Error::Invalid(format!("shard {}: {e}", self.tmp.display()));
        let start = self.at.next_multiple_of(LAYER_ALIGN);
        self.file
            .write_all(&vec![0u8; (start - self.at) as usize])
            .map_err(io)?;
        let mut bytes = Vec::new();
        block.write(&mut Put(&mut bytes));
        self.file.write_all(&bytes).map_err(io)?;
        self.index
            .push((start, bytes.len() as u64, Sha256::digest(&bytes).into()));
        self.at = start + bytes.len() as u64;
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
        header.resize(header_len(self.key.layers.len()), 0);
        file.write_all_at(&header, 0).map_err(io)?;
        file.sync_all().map_err(io)?;
        std::fs::rename(&self.tmp, &self.path).map_err(io)
    }
}

/// Remove what a writer of `path` that died before its rename left (`<name>.shard.<pid>.tmp` of a
/// process that no longer runs). Such a file is never read (only the renamed name is), but a
/// member killed mid-download would otherwise leave one behind at every crash. Where `/proc` does
/// not tell which processes run, nothing is removed.
fn sweep_orphans(path: &Path) {
    let (Some(dir), Some(name)) = (path.parent(), path.file_stem().and_then(|n| n.to_str())) else {
        return;
    };
    if !Path::new("/proc/self").exists() {
        return;
    }
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let prefix = format!("{name}.shard.");
    for entry in entries.flatten() {
        let file = entry.file_name();
        let Some(pid) = file
            .to_str()
            .and_then(|f| f.strip_prefix(&prefix))
            .and_then(|f| f.strip_suffix(".tmp"))
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        if pid != std::process::id() && !Path::new("/proc").join(pid.to_string()).exists() {
            let _ = std::fs::remove_file(entry.path());
        }
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

/// An opened shard file whose header and size agree with what it should hold.
pub(crate) struct Shard {
    path: PathBuf,
    file: std::fs::File,
    /// Where the layers start in the file.
    base: u64,
    /// The model index of local layer 0.
    first: usize,
    /// Per local layer: offset from `base`, length, SHA-256.
    index: Vec<(u64, u64, [u8; 32])>,
}

impl Shard {
    /// Open the shard at `path`, refused unless its header is `key`'s and its size is what the
    /// header says.
    pub(crate) fn open(path: &Path, key: &ShardKey) -> Result<Self> {
        let bad = |why: String| Error::Invalid(format!("shard {}: {why}", path.display()));
        if cfg!(target_endian = "big") {
            return Err(bad("shards are little-endian; this machine is not".into()));
        }
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
            return Err(bad("not a shard file of this version".into()));
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
        // Each layer where the previous one ends, moved up to the next multiple of 64.
        let mut end = 0u64;
        let mut contiguous = true;
        for &(offset, len, _) in &index {
            contiguous &= offset == end.next_multiple_of(LAYER_ALIGN);
            end = offset.saturating_add(len);
        }
        if !contiguous || size != header_len as u64 + end {
            return Err(bad(format!(
                "{size} bytes where its header promises {} (cut short, or not written whole)",
                header_len as u64 + end
            )));
        }
        Ok(Self {
            path: path.to_path_buf(),
            file,
            base: header_len as u64,
            first: key.layers.start,
            index,
        })
    }

    /// Local layer `i`'s bytes in the file.
    pub(crate) fn range(&self, i: usize) -> Range<usize> {
        let (offset, len, _) = self.index[i];
        let start = (self.base + offset) as usize;
        start..start + len as usize
    }

    /// The whole file in memory, for layers borrowed in place: read into huge pages
    /// (`daisy_gemm_int8::HugeBytes`, as loaded layers are: decode streams them on every token),
    /// or memory-mapped where such memory cannot be had.
    pub(crate) fn map(&self) -> Result<SharedBytes> {
        let len = self
            .file
            .metadata()
            .map_err(|e| Error::Invalid(format!("shard {}: {e}", self.path.display())))?
            .len();
        if let Some(mut bytes) = usize::try_from(len).ok().and_then(HugeBytes::zeroed) {
            self.file
                .read_exact_at(bytes.as_mut(), 0)
                .map_err(|e| Error::Invalid(format!("shard {}: {e}", self.path.display())))?;
            return Ok(Arc::new(bytes));
        }
        // SAFETY: the file is opened read-only and mapped read-only. A shard is only ever replaced
        // by renaming a new file over its name, which leaves this mapping on the old one; a
        // process truncating it in place would be outside what this cache folder promises.
        let map = unsafe { memmap2::Mmap::map(&self.file) }.map_err(|e| {
            Error::Invalid(format!("shard {}: mapping it: {e}", self.path.display()))
        })?;
        Ok(Arc::new(map))
    }

    /// Local layer `i` read into memory of its own (at offset 0, aligned for the GEMM).
    pub(crate) fn read(&self, i: usize) -> Result<(SharedBytes, Range<usize>)> {
        let len = self.range(i).len();
        let mut bytes = Aligned::zeroed(len);
        self.file
            .read_exact_at(bytes.as_mut(), self.range(i).start as u64)
            .map_err(|e| Error::Invalid(format!("shard {}: {e}", self.path.display())))?;
        Ok((Arc::new(bytes), 0..len))
    }

    /// Whether local layer `i`'s bytes (at `range` of `bytes`) hash to what the header says.
    pub(crate) fn check(&self, i: usize, bytes: &SharedBytes, range: Range<usize>) -> Result<()> {
        let all = AsRef::<[u8]>::as_ref(&**bytes);
        if <[u8; 32]>::from(Sha256::digest(&all[range])) != self.index[i].2 {
            return Err(Error::Invalid(format!(
                "shard {}: local layer {i} does not match its SHA-256 (the file changed)",
                self.path.display()
            )));
        }
        Ok(())
    }

    /// Local layer `i` from `bytes` (the mapped file when `range` is `None`, else that range of a
    /// buffer [`Shard::read`] filled), its SHA-256 checked when `check`.
    pub(crate) fn block(
        &self,
        cfg: &ModelConfig,
        precision: Precision,
        i: usize,
        bytes: &SharedBytes,
        range: Option<Range<usize>>,
        check: bool,
    ) -> Result<Block> {
        let range = range.unwrap_or_else(|| self.range(i));
        if check {
            self.check(i, bytes, range.clone())?;
        }
        let block = Block::read(
            cfg,
            precision,
            &mut Take::shared(bytes, range, "a shard layer"),
        )?;
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

    /// Layers in the file.
    pub(crate) fn layers(&self) -> usize {
        self.index.len()
    }

    /// Bytes of the layers in the file.
    pub(crate) fn bytes(&self) -> usize {
        self.index.iter().map(|i| i.1 as usize).sum()
    }

    /// Remove the file (a layer failed its check: the next start writes it again).
    pub(crate) fn remove(&self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Bytes in memory of their own, starting at a multiple of 64 (what a shard's arrays need).
struct Aligned {
    chunks: Vec<Chunk>,
    len: usize,
}

#[derive(Clone, Copy, bytemuck::Zeroable, bytemuck::Pod)]
#[repr(C, align(64))]
struct Chunk([u8; 64]);

impl Aligned {
    fn zeroed(len: usize) -> Self {
        Self {
            chunks: vec![Chunk([0; 64]); len.div_ceil(64)],
            len,
        }
    }
}

impl AsRef<[u8]> for Aligned {
    fn as_ref(&self) -> &[u8] {
        &bytemuck::cast_slice(&self.chunks)[..self.len]
    }
}

impl AsMut<[u8]> for Aligned {
    fn as_mut(&mut self) -> &mut [u8] {
        &mut bytemuck::cast_slice_mut(&mut self.chunks)[..self.len]
    }
}

/// Layers read from a shard file on demand, at most [`MAX_LIVE_LAYERS`] unpacked at once.
pub(crate) struct Streamed {
    pub(crate) shard: Shard,
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
    pub(crate) fn new(shard: Shard) -> Self {
        let n = shard.layers();
        Self {
            shard,
            live: Mutex::new(Live::new(n)),
        }
    }

    /// Local layer `i` read and unpacked (its SHA-256 checked when `check`).
    pub(crate) fn unpack(
        &self,
        cfg: &ModelConfig,
        precision: Precision,
        i: usize,
        check: bool,
    ) -> Result<Block> {
        let (bytes, range) = self.shard.read(i)?;
        let block = self
            .shard
            .block(cfg, precision, i, &bytes, Some(range), check);
        if block.is_err() && check {
            self.shard.remove();
        }
        block
    }

    pub(crate) fn live(&self) -> std::sync::MutexGuard<'_, Live<Block>> {
        self.live.lock().expect("live layers lock")
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
        let w: Vec<f32> = (0..18).map(|i| (i as f32 - 8.5) / 3.0).collect();
        let packed = PackedWeights::new(&w, 3, 6).unwrap();
        let mut bytes = Vec::new();
        let mut put = Put(&mut bytes);
        put.f32s(&[1.5, -0.0]);
        put.packed(&packed);
        let mut held = Aligned::zeroed(bytes.len());
        held.as_mut().copy_from_slice(&bytes);
        let shared: SharedBytes = Arc::new(held);
        let mut take = Take::shared(&shared, 0..bytes.len(), "a test");
        assert_eq!(
            take.f32s()
                .unwrap()
                .iter()
                .map(|v| v.to_bits())
                .collect::<Vec<_>>(),
            vec![1.5f32.to_bits(), (-0.0f32).to_bits()]
        );
        let back = take.packed(3, 6).unwrap();
        take.done().unwrap();
        let (a, b) = (back.to_quantized(), packed.to_quantized());
        assert_eq!((a.q(), a.scales()), (b.q(), b.scales()));
        // Borrowed in place, not copied.
        let at = AsRef::<[u8]>::as_ref(&*shared).as_ptr_range();
        assert!(at.contains(&back.scales().as_ptr().cast()));
        let mut cut = Take::shared(&shared, 0..bytes.len() - 1, "a test");
        cut.f32s().unwrap();
        let e = cut.packed(3, 6).unwrap_err().to_string();
        assert!(e.contains("overruns"), "{e}");
        let e = Take::new(&bytes[12..], "a test")
            .packed(3, 6)
            .unwrap_err()
            .to_string();
        assert!(e.contains("outside a shard"), "{e}");
        let mut huge = Vec::new();
        Put(&mut huge).u64(u64::MAX);
        assert!(Take::new(&huge, "a test").f32s().is_err());
    }

    #[test]
    fn a_dead_writers_temporary_file_is_removed_and_no_other() {
        let dir = std::env::temp_dir().join(format!("daisy-sweep-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        // No pid reaches 4194304 (Linux's limit): 99999999 is a writer that died.
        let names = [
            "2-30-int8.shard.99999999.tmp",
            &format!("2-30-int8.shard.{}.tmp", std::process::id()),
            "2-31-int8.shard.99999999.tmp",
            "2-30-int8.shard",
        ];
        for n in &names {
            std::fs::write(dir.join(n), b"x").unwrap();
        }
        sweep_orphans(&dir.join("2-30-int8.shard"));
        let left: Vec<bool> = names.iter().map(|n| dir.join(n).exists()).collect();
        std::fs::remove_dir_all(&dir).unwrap();
        if Path::new("/proc/self").exists() {
            assert_eq!(left, [false, true, true, true]);
        } else {
            assert_eq!(left, [true, true, true, true]);
        }
    }
}
