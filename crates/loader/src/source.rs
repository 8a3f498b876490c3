//! Where checkpoint bytes come from: the [`ByteSource`] trait (positional reads of one file) and the
//! [`Repo`] trait (the named files of one model), with local-file implementations and the Hugging
//! Face cache layout. Nothing above the loader knows whether bytes come from a disk or a network.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use daisy_wire::{ModelRef, RepoId};

use crate::Error;

/// One file's bytes, read by absolute offset. Implementations must be usable from several threads.
// `len` is fallible (a remote source asks the server), so an `is_empty` would only mislead.
#[allow(clippy::len_without_is_empty)]
pub trait ByteSource: Send + Sync {
    /// Total length in bytes.
    fn len(&self) -> Result<u64, Error>;
    /// Exactly `len` bytes starting at `offset`; a range past the end is an error.
    fn read_at(&self, offset: u64, len: usize) -> Result<Vec<u8>, Error>;
    /// A short human-readable name (a path or a URL) used in error messages.
    fn describe(&self) -> String;
    /// Announce the `(offset, len)` ranges about to be read, so a remote source can fetch them
    /// ahead, coalesced; a local source ignores it.
    fn prefetch(&self, _ranges: &[(u64, u64)]) {}
    /// The `len` bytes at `offset` memory-mapped, where the source is a local file (`None`
    /// otherwise): pages are read from the file when touched and can be given back
    /// ([`MappedBytes::release`]), so only what is used stays resident.
    fn map(&self, _offset: u64, _len: usize) -> Option<Result<MappedBytes, Error>> {
        None
    }
}

/// A byte range of a local file, memory-mapped read-only.
///
/// The model files are the user's: one rewritten while mapped shows its new bytes, and one cut
/// short faults on access — as with any loader that maps its model. The Hugging Face cache never
/// rewrites a file in place (it renames a finished download into place).
pub struct MappedBytes {
    map: memmap2::Mmap,
    /// The file it maps, and where in it the mapping starts ([`Self::read_at`]; elsewhere than on
    /// Unix it copies from the mapping instead).
    #[cfg_attr(not(unix), allow(dead_code))]
    file: Arc<std::fs::File>,
    #[cfg_attr(not(unix), allow(dead_code))]
    offset: u64,
    path: Arc<PathBuf>,
}

impl MappedBytes {
    pub fn bytes(&self) -> &[u8] {
        &self.map
    }

    /// Fill `out` with the bytes at `at` (of [`Self::bytes`]) by a positioned read of the file, not
    /// through the mapping: the bytes come from the page cache, and nothing becomes resident in
    /// this process — no page fault, and no page to give back afterwards (giving pages back
    /// ([`Self::release`]) makes the kernel flush the other CPUs' address translations, tens of
    /// microseconds on a virtual machine). For a few rows of a large table, one at a time.
    pub fn read_at(&self, at: usize, out: &mut [u8]) -> Result<(), Error> {
        // Within the mapped range (the file may be longer: the range is the caller's bound).
        check_range(
            || self.path.display().to_string(),
            at as u64,
            out.len(),
            self.map.len() as u64,
        )?;
        #[cfg(unix)]
        {
            use std::os::unix::fs::FileExt;
            self.file
                .read_exact_at(out, self.offset + at as u64)
                .map_err(|source| Error::Io {
                    path: self.path.display().to_string(),
                    source,
                })
        }
        #[cfg(not(unix))]
        {
            out.copy_from_slice(&self.map[at..at + out.len()]);
            Ok(())
        }
    }

    /// Give the pages of `range` (of [`Self::bytes`]) back: they stop counting as resident and are
    /// read from the file again when next touched.
    pub fn release(&self, range: std::ops::Range<usize>) {
        let end = range.end.min(self.map.len());
        if end > range.start {
            // SAFETY: a read-only private file mapping: MADV_DONTNEED drops its pages (those at the
            // range's edges too), and the next access reads the same file bytes again — there is
            // no anonymous data to lose.
            let _ = unsafe {
                self.map.unchecked_advise_range(
                    memmap2::UncheckedAdvice::DontNeed,
                    range.start,
                    end - range.start,
                )
            };
        }
    }
}

impl std::fmt::Debug for MappedBytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "MappedBytes({} bytes)", self.map.len())
    }
}

impl AsRef<[u8]> for MappedBytes {
    fn as_ref(&self) -> &[u8] {
        self.bytes()
    }
}

/// A local file read with positional reads.
pub struct FileSource {
    path: Arc<PathBuf>,
    file: Arc<std::fs::File>,
    size: u64,
    #[cfg(not(unix))]
    lock: std::sync::Mutex<()>,
}

impl FileSource {
    pub fn open(path: &Path) -> Result<FileSource, Error> {
        let io = |source| Error::Io {
            path: path.display().to_string(),
            source,
        };
        let file = std::fs::File::open(path).map_err(io)?;
        let size = file.metadata().map_err(io)?.len();
        Ok(FileSource {
            path: Arc::new(path.to_path_buf()),
            file: Arc::new(file),
            size,
            #[cfg(not(unix))]
            lock: std::sync::Mutex::new(()),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl ByteSource for FileSource {
    fn len(&self) -> Result<u64, Error> {
        Ok(self.size)
    }

    fn read_at(&self, offset: u64, len: usize) -> Result<Vec<u8>, Error> {
        check_range(|| self.describe(), offset, len, self.size)?;
        let mut buf = vec![0u8; len];
        let io = |source| Error::Io {
            path: self.describe(),
            source,
        };
        #[cfg(unix)]
        {
            use std::os::unix::fs::FileExt;
            self.file.read_exact_at(&mut buf, offset).map_err(io)?;
        }
        #[cfg(not(unix))]
        {
            use std::io::{Read, Seek, SeekFrom};
            let _guard = self.lock.lock().unwrap_or_else(|e| e.into_inner());
            let mut file: &std::fs::File = &self.file;
            file.seek(SeekFrom::Start(offset)).map_err(io)?;
            file.read_exact(&mut buf).map_err(io)?;
        }
        Ok(buf)
    }

    fn describe(&self) -> String {
        self.path.display().to_string()
    }

    fn map(&self, offset: u64, len: usize) -> Option<Result<MappedBytes, Error>> {
        if let Err(e) = check_range(|| self.describe(), offset, len, self.size) {
            return Some(Err(e));
        }
        // SAFETY: a read-only mapping of the model file; `MappedBytes` says what a change to the
        // file underneath means.
        let map = unsafe {
            memmap2::MmapOptions::new()
                .offset(offset)
                .len(len)
                .map(&self.file)
        };
        let mapped = |map| MappedBytes {
            map,
            file: self.file.clone(),
            offset,
            path: self.path.clone(),
        };
        Some(map.map(mapped).map_err(|source| Error::Io {
            path: self.describe(),
            source,
        }))
    }
}

/// Bytes held in memory (tests, and files small enough to fetch whole).
pub struct MemSource {
    name: String,
    bytes: Vec<u8>,
}

impl MemSource {
    pub fn new(name: &str, bytes: Vec<u8>) -> MemSource {
        MemSource {
            name: name.to_string(),
            bytes,
        }
    }
}

impl ByteSource for MemSource {
    fn len(&self) -> Result<u64, Error> {
        Ok(self.bytes.len() as u64)
    }

    fn read_at(&self, offset: u64, len: usize) -> Result<Vec<u8>, Error> {
        check_range(|| self.name.clone(), offset, len, self.bytes.len() as u64)?;
        let start = offset as usize;
        Ok(self.bytes[start..start + len].to_vec())
    }

    fn describe(&self) -> String {
        self.name.clone()
    }
}

/// `offset..offset + len` within `size` bytes, or refused naming `what` (made only then: a mapped
/// table's rows are checked once a token).
fn check_range(
    what: impl FnOnce() -> String,
    offset: u64,
    len: usize,
    size: u64,
) -> Result<(), Error> {
    match offset.checked_add(len as u64) {
        Some(end) if end <= size => Ok(()),
        _ => Err(Error::OutOfRange {
            what: what(),
            offset,
            len: len as u64,
            size,
        }),
    }
}

/// The named files of one model repository (a local folder, a cache snapshot, later the Hub).
pub trait Repo: Send + Sync {
    /// The file `name` (a path relative to the repository root), or `None` when it does not exist.
    fn open(&self, name: &str) -> Result<Option<Arc<dyn ByteSource>>, Error>;
    /// A short human-readable name used in error messages.
    fn describe(&self) -> String;
}

/// A local folder in Hugging Face layout.
pub struct LocalDir {
    root: PathBuf,
}

impl LocalDir {
    pub fn new(root: &Path) -> LocalDir {
        LocalDir {
            root: root.to_path_buf(),
        }
    }
}

impl Repo for LocalDir {
    fn open(&self, name: &str) -> Result<Option<Arc<dyn ByteSource>>, Error> {
        if name.split('/').any(|part| part == ".." || part.is_empty()) {
            return Err(Error::NotFound(format!(
                "refusing file name `{name}` outside the model folder"
            )));
        }
        let path = self.root.join(name);
        if !path.is_file() {
            return Ok(None);
        }
        Ok(Some(Arc::new(FileSource::open(&path)?)))
    }

    fn describe(&self) -> String {
        self.root.display().to_string()
    }
}

/// The revision a model reference without `@revision` stands for.
pub const DEFAULT_REVISION: &str = "main";

/// Parse `org/name[@revision]` by the wire's grammar (the one contract for repo ids, shared with
/// every peer); anything else is refused, quoting the text.
pub fn parse_model_ref(text: &str) -> Result<ModelRef, Error> {
    ModelRef::parse(text).map_err(|e| {
        Error::NotFound(format!(
            "`{text}` is neither an existing local path nor a repo id of the form \
             org/name[@revision] ({e})"
        ))
    })
}

/// The revision `model` asks for, `main` when it names none.
pub fn revision_of(model: &ModelRef) -> &str {
    model
        .revision
        .as_ref()
        .map_or(DEFAULT_REVISION, |r| r.as_str())
}

/// The folder of `repo` in a Hugging Face cache at `cache`: `models--org--name`.
pub fn cache_folder(cache: &Path, repo: &RepoId) -> PathBuf {
    cache.join(format!("models--{}--{}", repo.org(), repo.name()))
}

/// The Hugging Face hub cache folder: `HF_HUB_CACHE`, else `$HF_HOME/hub`, else
/// `~/.cache/huggingface/hub`.
pub fn hf_cache_dir() -> Option<PathBuf> {
    let var = |k: &str| {
        std::env::var_os(k)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    if let Some(dir) = var("HF_HUB_CACHE") {
        return Some(dir);
    }
    if let Some(home) = var("HF_HOME") {
        return Some(home.join("hub"));
    }
    var("HOME").map(|home| home.join(".cache").join("huggingface").join("hub"))
}

/// A resolved snapshot in the Hugging Face cache: its folder and the commit it belongs to.
#[derive(Clone, Debug)]
pub struct CachedSnapshot {
    pub dir: PathBuf,
    pub commit: String,
}

/// Look `repo` up in the cache at `cache`: `models--org--name/refs/<rev>` names the commit, whose
/// files are in `snapshots/<commit>/`. A revision that is itself a snapshot folder is taken as is.
pub fn find_in_cache(cache: &Path, model: &ModelRef) -> Result<CachedSnapshot, Error> {
    let folder = cache_folder(cache, &model.repo);
    let revision = revision_of(model);
    let refs = folder.join("refs").join(revision);
    let commit = if refs.is_file() {
        let text = std::fs::read_to_string(&refs).map_err(|source| Error::Io {
            path: refs.display().to_string(),
            source,
        })?;
        text.trim().to_string()
    } else if folder.join("snapshots").join(revision).is_dir() {
        revision.to_string()
    } else {
        return Err(Error::NotFound(format!(
            "model `{}` revision `{revision}` is not a local path and not in the Hugging Face \
             cache at {} (looked for {})",
            model.repo,
            cache.display(),
            refs.display()
        )));
    };
    if commit.is_empty() || !commit.chars().all(|c| c.is_ascii_alphanumeric()) {
        return Err(Error::NotFound(format!(
            "{}: invalid commit `{commit}`",
            refs.display()
        )));
    }
    let dir = folder.join("snapshots").join(&commit);
    if !dir.is_dir() {
        return Err(Error::NotFound(format!(
            "model `{}`: snapshot folder {} for commit {commit} is missing",
            model.repo,
            dir.display()
        )));
    }
    Ok(CachedSnapshot { dir, commit })
}
