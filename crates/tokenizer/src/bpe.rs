//! The BPE model: merges applied lowest rank first, leftmost first among equal ranks, with the
//! priority queue and stale-entry rule of `tokenizers`' `models/bpe/word.rs`, and a cache per word.

use std::collections::{BinaryHeap, HashMap};
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::RwLock;

use crate::Error;
use crate::config::BpeConfig;

/// A small multiplicative hasher for integer and short string keys (FxHash's mixing).
#[derive(Default, Clone, Copy)]
pub(crate) struct FxHasher(u64);

const SEED: u64 = 0x51_7c_c1_b7_27_22_0a_95;

impl Hasher for FxHasher {
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            let mut w = [0u8; 8];
            w.copy_from_slice(c);
            self.add(u64::from_le_bytes(w));
        }
        let rest = chunks.remainder();
        if !rest.is_empty() {
            let mut w = [0u8; 8];
            w[..rest.len()].copy_from_slice(rest);
            self.add(u64::from_le_bytes(w) ^ ((rest.len() as u64) << 56));
        }
    }
    #[inline]
    fn write_u8(&mut self, i: u8) {
        self.add(u64::from(i));
    }
    #[inline]
    fn write_u32(&mut self, i: u32) {
        self.add(u64::from(i));
    }
    #[inline]
    fn write_u64(&mut self, i: u64) {
        self.add(i);
    }
    #[inline]
    fn write_usize(&mut self, i: usize) {
        self.add(i as u64);
    }
    #[inline]
    fn finish(&self) -> u64 {
        self.0
    }
}

impl FxHasher {
    #[inline]
    fn add(&mut self, w: u64) {
        self.0 = (self.0.rotate_left(5) ^ w).wrapping_mul(SEED);
    }
}

pub(crate) type FxMap<K, V> = HashMap<K, V, BuildHasherDefault<FxHasher>>;

/// Words at least this long (in bytes) are not cached, as in `tokenizers` (`MAX_LENGTH`).
const CACHE_MAX_WORD: usize = 256;
/// The cache is emptied when it reaches this many words, bounding memory.
const CACHE_CAPACITY: usize = 100_000;

#[derive(Debug)]
pub(crate) struct Bpe {
    vocab: FxMap<String, u32>,
    /// Ids of the characters below `CHAR_TABLE` (all byte-level characters are): faster than a
    /// string lookup per character.
    char_ids: Vec<Option<u32>>,
    /// (left id, right id) → (rank, merged id).
    merges: FxMap<(u32, u32), (u32, u32)>,
    unk: Option<u32>,
    fuse_unk: bool,
    ignore_merges: bool,
    cache: RwLock<FxMap<String, Box<[u32]>>>,
}

const CHAR_TABLE: usize = 0x800;

impl Bpe {
    pub(crate) fn new(cfg: BpeConfig) -> Result<Bpe, Error> {
        let mut vocab: FxMap<String, u32> = FxMap::default();
        vocab.reserve(cfg.vocab.len());
        let mut ids: FxMap<u32, &str> = FxMap::default();
        for (token, id) in &cfg.vocab {
            if let Some(other) = ids.insert(*id, token) {
                return Err(Error::Invalid(format!(
                    "vocabulary gives id {id} to both {other:?} and {token:?}, expected one token per id"
                )));
            }
            vocab.insert(token.clone(), *id);
        }
        drop(ids);
        let mut merges: FxMap<(u32, u32), (u32, u32)> = FxMap::default();
        merges.reserve(cfg.merges.len());
        for (rank, (a, b)) in cfg.merges.iter().enumerate() {
            let missing = |t: &str| {
                Error::Invalid(format!(
                    "merge {} {a:?} {b:?}: token {t:?} is not in the vocabulary",
                    rank + 1
                ))
            };
            let a_id = *vocab.get(a).ok_or_else(|| missing(a))?;
            let b_id = *vocab.get(b).ok_or_else(|| missing(b))?;
            let joined = format!("{a}{b}");
            let new_id = *vocab.get(&joined).ok_or_else(|| missing(&joined))?;
            let rank = u32::try_from(rank).map_err(|_| Error::Invalid("too many merges".into()))?;
            // A repeated pair keeps its last rank, as a HashMap insert does in `tokenizers`.
            merges.insert((a_id, b_id), (rank, new_id));
        }
        let unk = match &cfg.unk_token {
            Some(t) => match vocab.get(t) {
                Some(id) => Some(*id),
                None => {
                    return Err(Error::Invalid(format!(
                        "unk_token {t:?} is not in the vocabulary"
                    )));
                }
            },
            None => None,
        };
        let mut char_ids = vec![None; CHAR_TABLE];
        let mut buf = [0u8; 4];
        for (cp, slot) in char_ids.iter_mut().enumerate() {
            if let Some(c) = char::from_u32(cp as u32) {
                *slot = vocab.get(&*c.encode_utf8(&mut buf)).copied();
            }
        }
        Ok(Bpe {
            vocab,
            char_ids,
            merges,
            unk,
            fuse_unk: cfg.fuse_unk,
            ignore_merges: cfg.ignore_merges,
            cache: RwLock::new(FxMap::default()),
        })
    }

    pub(crate) fn id_to_token_map(&self) -> HashMap<u32, String> {
        self.vocab.iter().map(|(t, id)| (*id, t.clone())).collect()
    }

    pub(crate) fn token_to_id(&self, token: &str) -> Option<u32> {
        self.vocab.get(token).copied()
    }

    pub(crate) fn vocab_len(&self) -> usize {
        self.vocab.len()
    }

    /// Appends the ids of one pre-tokenized word.
    pub(crate) fn tokenize(&self, word: &str, out: &mut Vec<u32>) {
        if word.is_empty() {
            return;
        }
        if self.ignore_merges
            && let Some(id) = self.vocab.get(word)
        {
            out.push(*id);
            return;
        }
        let cacheable = word.len() < CACHE_MAX_WORD;
        if cacheable
            && let Ok(cache) = self.cache.read()
            && let Some(ids) = cache.get(word)
        {
            out.extend_from_slice(ids);
            return;
        }
        let start = out.len();
        self.merge_word(word, out);
        if cacheable && let Ok(mut cache) = self.cache.write() {
            if cache.len() >= CACHE_CAPACITY {
                cache.clear();
            }
            cache.insert(word.to_owned(), out[start..].into());
        }
    }

    fn char_id(&self, s: &str) -> Option<u32> {
        let mut chars = s.chars();
        if let (Some(c), None) = (chars.next(), chars.next())
            && let Some(slot) = self.char_ids.get(c as usize)
        {
            return *slot;
        }
        self.vocab.get(s).copied()
    }

    fn merge_word(&self, w: &str, out: &mut Vec<u32>) {
        let mut symbols: Vec<Symbol> = Vec::with_capacity(w.len());
        let mut unk: Option<(u32, usize)> = None;
        let push = |symbols: &mut Vec<Symbol>, c: u32, len: usize| {
            let n = symbols.len() as isize;
            if let Some(last) = symbols.last_mut() {
                last.next = n;
            }
            symbols.push(Symbol {
                c,
                prev: n - 1,
                next: -1,
                len,
            });
        };
        for (i, ch) in w.char_indices() {
            let s = &w[i..i + ch.len_utf8()];
            if let Some(id) = self.char_id(s) {
                if let Some((unk_id, unk_len)) = unk.take() {
                    push(&mut symbols, unk_id, unk_len);
                }
                push(&mut symbols, id, s.len());
            } else if let Some(unk_id) = self.unk {
                unk = match unk {
                    Some((u, len)) if self.fuse_unk => Some((u, len + s.len())),
                    Some((u, len)) => {
                        push(&mut symbols, u, len);
                        Some((unk_id, s.len()))
                    }
                    None => Some((unk_id, s.len())),
                };
            }
            // Without an unk token, a character the vocabulary lacks is dropped, as in `tokenizers`.
        }
        if let Some((unk_id, unk_len)) = unk {
            push(&mut symbols, unk_id, unk_len);
        }
        if symbols.len() > 1 {
            self.merge_all(&mut symbols);
        }
        out.extend(symbols.iter().filter(|s| s.len != 0).map(|s| s.c));
    }

    fn merge_all(&self, symbols: &mut [Symbol]) {
        let mut queue: BinaryHeap<Merge> = BinaryHeap::with_capacity(symbols.len());
        for (pos, pair) in symbols.windows(2).enumerate() {
            if let Some(&(rank, new_id)) = self.merges.get(&(pair[0].c, pair[1].c)) {
                queue.push(Merge { pos, rank, new_id });
            }
        }
        while let Some(top) = queue.pop() {
            let cur = symbols[top.pos];
            if cur.len == 0 || cur.next == -1 {
                continue;
            }
            let next_pos = cur.next as usize;
            let right = symbols[next_pos];
            match self.merges.get(&(cur.c, right.c)) {
                Some(&(_, new_id)) if new_id == top.new_id => {}
                _ => continue,
            }
            {
                let s = &mut symbols[top.pos];
                s.c = top.new_id;
                s.len += right.len;
                s.next = right.next;
            }
            symbols[next_pos].len = 0;
            if right.next > -1 && (right.next as usize) < symbols.len() {
                symbols[right.next as usize].prev = top.pos as isize;
            }
            let current = symbols[top.pos];
            if current.prev >= 0 {
                let prev = current.prev as usize;
                if let Some(&(rank, new_id)) = self.merges.get(&(symbols[prev].c, current.c)) {
                    queue.push(Merge {
                        pos: prev,
                        rank,
                        new_id,
                    });
                }
            }
            let next = current.next as usize;
            if current.next >= 0
                && next < symbols.len()
                && let Some(&(rank, new_id)) = self.merges.get(&(current.c, symbols[next].c))
            {
                queue.push(Merge {
                    pos: top.pos,
                    rank,
                    new_id,
                });
            }
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct Symbol {
    c: u32,
    prev: isize,
    next: isize,
    len: usize,
}

#[derive(Debug)]
struct Merge {
    pos: usize,
    rank: u32,
    new_id: u32,
}

impl Ord for Merge {
    /// The max-heap pops the lowest rank, then the lowest position.
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        other
            .rank
            .cmp(&self.rank)
            .then_with(|| other.pos.cmp(&self.pos))
    }
}

impl PartialEq for Merge {
    fn eq(&self, other: &Self) -> bool {
        self.rank == other.rank && self.pos == other.pos
    }
}

impl Eq for Merge {}

impl PartialOrd for Merge {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
