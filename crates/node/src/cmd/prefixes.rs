//! The head's record of conversation prefixes (GUIDE "Scheduling"): per conversation, the SHA-256 of
//! its first 64 prompt tokens, filed under the SHA-256 of its first block (16 tokens) and the model
//! fingerprint, in `$XDG_DATA_HOME/daisychain-infer/prefixes.json`, read back when the head starts.
//! Conversations that share a first block (a system prompt) keep separate records under it, so two
//! chats never erase each other. It is a record, not a cache: every turn still computes every
//! position it needs (the full-window pass recomputes the prefix).

use std::collections::BTreeMap;
use std::path::PathBuf;

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// Tokens of the first block, the key.
const BLOCK: usize = 16;
/// Tokens whose hash identifies a conversation.
const PREFIX: usize = 64;
/// Conversations kept per first block (the least recently seen go first).
const PER_BLOCK: usize = 64;
/// First blocks kept (the least recently seen go first).
const BLOCKS: usize = 4096;

/// One conversation's record.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Prefix {
    /// SHA-256 (hex) over the little-endian ids of the first `tokens` prompt tokens.
    pub(crate) prefix_sha256: String,
    pub(crate) tokens: usize,
    /// Turns seen with this prefix, across restarts.
    pub(crate) turns: u64,
    /// When it was last seen, as a counter over every turn recorded.
    seen: u64,
}

/// What a turn's report says of its conversation.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct Seen {
    pub(crate) block_sha256: String,
    #[serde(flatten)]
    pub(crate) prefix: Prefix,
}

#[derive(Default, Serialize, Deserialize)]
struct File {
    /// Next value of `seen`.
    clock: u64,
    /// Key: model fingerprint (hex), `:`, SHA-256 of the first block (hex).
    blocks: BTreeMap<String, Vec<Prefix>>,
}

/// The record and where it lives.
pub(crate) struct Prefixes {
    path: PathBuf,
    file: File,
}

fn sha256_ids(ids: &[u32]) -> String {
    let mut h = Sha256::new();
    for id in ids {
        h.update(id.to_le_bytes());
    }
    hex::encode(h.finalize())
}

impl Prefixes {
    /// `$XDG_DATA_HOME/daisychain-infer/prefixes.json` (or the platform's data folder).
    pub(crate) fn default_path() -> Option<PathBuf> {
        dirs::data_dir().map(|d| d.join("daisychain-infer").join("prefixes.json"))
    }

    /// Read the record at `path`; none yet is an empty record. A file that is not a record is
    /// refused by name rather than overwritten.
    pub(crate) fn open(path: PathBuf) -> Result<Self> {
        let file = match std::fs::read(&path) {
            Ok(bytes) => serde_json::from_slice(&bytes).with_context(|| {
                format!(
                    "{} is not a record of conversation prefixes (move it away to start a new one)",
                    path.display()
                )
            })?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => File::default(),
            Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
        };
        Ok(Self { path, file })
    }

    /// Conversations on record.
    pub(crate) fn len(&self) -> usize {
        self.file.blocks.values().map(Vec::len).sum()
    }

    pub(crate) fn path(&self) -> &std::path::Path {
        &self.path
    }

    /// Record a turn of `prompt` on the model `fingerprint` and save the record (written whole to a
    /// temporary file, then renamed over the old one).
    pub(crate) fn record(&mut self, fingerprint: &[u8; 32], prompt: &[u32]) -> Result<Seen> {
        let block = sha256_ids(&prompt[..prompt.len().min(BLOCK)]);
        let tokens = prompt.len().min(PREFIX);
        let prefix_sha256 = sha256_ids(&prompt[..tokens]);
        let clock = self.file.clock;
        self.file.clock += 1;
        let list = self
            .file
            .blocks
            .entry(format!("{}:{block}", hex::encode(fingerprint)))
            .or_default();
        let at = match list.iter().position(|p| p.prefix_sha256 == prefix_sha256) {
            Some(i) => i,
            None => {
                if list.len() == PER_BLOCK
                    && let Some(oldest) = (0..list.len()).min_by_key(|&i| list[i].seen)
                {
                    list.remove(oldest);
                }
                list.push(Prefix {
                    prefix_sha256,
                    tokens,
                    turns: 0,
                    seen: clock,
                });
                list.len() - 1
            }
        };
        list[at].turns += 1;
        list[at].seen = clock;
        let prefix = list[at].clone();
        if self.file.blocks.len() > BLOCKS
            && let Some(oldest) = self
                .file
                .blocks
                .iter()
                .min_by_key(|(_, l)| l.iter().map(|p| p.seen).max())
                .map(|(k, _)| k.clone())
        {
            self.file.blocks.remove(&oldest);
        }
        self.save()?;
        Ok(Seen {
            block_sha256: block,
            prefix,
        })
    }

    fn save(&self) -> Result<()> {
        let dir = self.path.parent().unwrap_or(std::path::Path::new("."));
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        // Each process its own temporary file, so heads sharing the folder never mix their bytes.
        let tmp = self
            .path
            .with_extension(format!("json.{}.tmp", std::process::id()));
        let bytes = serde_json::to_vec_pretty(&self.file).expect("a record serializes");
        std::fs::write(&tmp, bytes).with_context(|| format!("writing {}", tmp.display()))?;
        std::fs::rename(&tmp, &self.path)
            .with_context(|| format!("replacing {}", self.path.display()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_conversations_sharing_a_first_block_keep_their_own_records() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("d/prefixes.json");
        let fp = [7u8; 32];
        let system: Vec<u32> = (0..20).collect();
        let a: Vec<u32> = system.iter().copied().chain([100, 101]).collect();
        let b: Vec<u32> = system.iter().copied().chain([200]).collect();
        let mut r = Prefixes::open(path.clone()).unwrap();
        assert_eq!(r.record(&fp, &a).unwrap().prefix.turns, 1);
        assert_eq!(r.record(&fp, &b).unwrap().prefix.turns, 1);
        let again = r.record(&fp, &a).unwrap();
        assert_eq!((again.prefix.turns, again.prefix.tokens), (2, 22));
        // Another model's turns are its own.
        assert_eq!(r.record(&[8u8; 32], &a).unwrap().prefix.turns, 1);
        assert_eq!(r.len(), 3);
        // Read back: the same record.
        let mut back = Prefixes::open(path.clone()).unwrap();
        assert_eq!(back.len(), 3);
        assert_eq!(back.record(&fp, &b).unwrap().prefix.turns, 2);
        // Not a record: refused by name, left as it is.
        std::fs::write(&path, b"not json").unwrap();
        let e = Prefixes::open(path.clone()).err().unwrap();
        assert!(format!("{e:#}").contains("is not a record of conversation prefixes"));
        assert_eq!(std::fs::read(&path).unwrap(), b"not json");
    }
}
