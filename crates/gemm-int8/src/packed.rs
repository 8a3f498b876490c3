//! Weights quantized once into the CPU kernels' panel layout, behind a handle.
//!
//! Layout: output channels in panels of 16; within a panel, K in groups of 4; one 64-byte line per
//! (panel, group) holding `qb[16p + c][4g + j]` at byte `4c + j`. That line is exactly one operand of
//! AVX-512 `vpdpbusd` (16 i32 lanes, each a 4-term dot product) and two of the AVX2 kernel. Panels go
//! in blocks of [`NP`] (the widest register tile); within a block the lines go group by group, the
//! block's panels side by side (`[block][group][panel of the block]`), so a block — and a run of
//! blocks — streams from memory front to back as one sequence, which is what decode (T = 1) needs.
//! The last block may hold fewer panels. Columns past N are zero.
//! The last `K mod 4` values of each row live row-major in `tail`, for the kernels' scalar leftover
//! loop. `corr` holds `128 · Σ qb[n][k]` over the grouped part of K, which undoes the +128 offset that
//! makes A unsigned for `vpdpbusd`.

use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::kernels::NP;
use crate::quant::{Quantized, quantize};
use crate::{Error, Operand};

/// Output channels per panel.
pub(crate) const PANEL: usize = 16;

/// One 64-byte line of a panel: 16 channels × 4 consecutive K values.
#[derive(Clone, Copy, bytemuck::Zeroable, bytemuck::Pod)]
#[repr(C, align(64))]
pub(crate) struct Line(pub(crate) [i8; 64]);

/// Packs `b`'s rows as rows `col0..` of a weight of `panels` panels (the layout above): their
/// lines, their corrections and their tails.
fn pack_rows(
    b: &Quantized,
    col0: usize,
    panels: usize,
    lines: &mut [Line],
    corr: &mut [i32],
    tail: &mut [i8],
) {
    let k = b.k();
    let (groups, kmain) = (k / 4, k - k % 4);
    let left = k - kmain;
    for i in 0..b.rows() {
        let (col, row) = (col0 + i, b.row(i));
        let (p, c) = (col / PANEL, col % PANEL);
        let (first, stride) = line_place(panels, groups, p);
        for (g, quad) in row[..kmain].chunks_exact(4).enumerate() {
            lines[first + g * stride].0[4 * c..4 * c + 4].copy_from_slice(quad);
        }
        corr[col] = 128 * row[..kmain].iter().map(|&v| i32::from(v)).sum::<i32>();
        tail[col * left..(col + 1) * left].copy_from_slice(&row[kmain..]);
    }
}

/// A weight of `n × k` packed as its quantized rows come, straight into the memory its handle then
/// borrows (2 MiB pages where the OS gives them; owned arrays where it does not), so that nothing
/// of the weight's size is held beside it while it is built. (A tied lm_head quantized whole and
/// then packed was held twice over: 2 × 136 MB at load for Qwen2.5-0.5B's.)
pub struct PackedBuilder {
    n: usize,
    k: usize,
    /// Rows packed so far.
    done: usize,
    place: Place,
}

/// Where a [`PackedBuilder`] writes.
enum Place {
    Huge {
        bytes: HugeBytes,
        /// Lines, tail, corrections, scales (the order of [`PackedWeights::from_shared`]).
        ranges: [Range<usize>; 4],
    },
    Owned {
        lines: Vec<Line>,
        tail: Vec<i8>,
        corr: Vec<i32>,
        scales: Vec<f32>,
    },
}

impl PackedBuilder {
    /// Room for `n` rows of `k`; refuses `k` past the kernels' limit.
    pub fn new(n: usize, k: usize) -> Result<Self, Error> {
        Self::new_in(n, k, true)
    }

    /// As [`new`](Self::new), in 2 MiB pages if `huge` and the OS gives them.
    fn new_in(n: usize, k: usize, huge: bool) -> Result<Self, Error> {
        if k > crate::MAX_K {
            return Err(Error::KTooLarge { k });
        }
        let (panels, groups) = (n.div_ceil(PANEL), k / 4);
        let lens = [
            panels * groups * size_of::<Line>(),
            n * (k % 4),
            panels * PANEL * size_of::<i32>(),
            n * size_of::<f32>(),
        ];
        let mut ranges: [Range<usize>; 4] = Default::default();
        let mut at = 0;
        for (range, len) in ranges.iter_mut().zip(lens) {
            *range = at..at + len;
            at = (at + len).next_multiple_of(size_of::<Line>());
        }
        let place = match huge.then(|| HugeBytes::zeroed(at)).flatten() {
            Some(bytes) => Place::Huge { bytes, ranges },
            None => Place::Owned {
                lines: vec![Line([0; 64]); panels * groups],
                tail: vec![0; n * (k % 4)],
                corr: vec![0; panels * PANEL],
                scales: vec![0.0; n],
            },
        };
        Ok(Self {
            n,
            k,
            done: 0,
            place,
        })
    }

    /// Pack the next rows; refused when their K differs or they are more than the rows left.
    pub fn push(&mut self, b: &Quantized) -> Result<(), Error> {
        if b.k() != self.k {
            return Err(Error::Shape {
                what: "rows for a packed weight (K)",
                got: b.k(),
                expected: self.k,
            });
        }
        if b.rows() > self.n - self.done {
            return Err(Error::Shape {
                what: "rows for a packed weight",
                got: self.done + b.rows(),
                expected: self.n,
            });
        }
        let (col0, panels) = (self.done, self.n.div_ceil(PANEL));
        let rows = col0..col0 + b.rows();
        match &mut self.place {
            Place::Huge { bytes, ranges } => {
                let all = bytes.as_mut();
                let (lines, rest) = all.split_at_mut(ranges[1].start);
                let (tail, rest) = rest.split_at_mut(ranges[2].start - ranges[1].start);
                let (corr, scales) = rest.split_at_mut(ranges[3].start - ranges[2].start);
                let lines: &mut [Line] = typed(lines, &ranges[0], 0)?;
                let corr: &mut [i32] = typed(corr, &ranges[2], ranges[2].start)?;
                let scales: &mut [f32] = typed(scales, &ranges[3], ranges[3].start)?;
                let tail: &mut [i8] = bytemuck::cast_slice_mut(&mut tail[..ranges[1].len()]);
                pack_rows(b, col0, panels, lines, corr, tail);
                scales[rows].copy_from_slice(b.scales());
            }
            Place::Owned {
                lines,
                tail,
                corr,
                scales,
            } => {
                pack_rows(b, col0, panels, lines, corr, tail);
                scales[rows].copy_from_slice(b.scales());
            }
        }
        self.done += b.rows();
        Ok(())
    }

    /// Rows packed so far.
    pub fn rows(&self) -> usize {
        self.done
    }

    /// The packed weight, refused unless all its rows were pushed.
    pub fn finish(self) -> Result<PackedWeights, Error> {
        if self.done != self.n {
            return Err(Error::Shape {
                what: "rows for a packed weight",
                got: self.done,
                expected: self.n,
            });
        }
        match self.place {
            Place::Huge { bytes, ranges } => {
                let shared: SharedBytes = Arc::new(bytes);
                PackedWeights::from_shared(self.n, self.k, &shared, ranges)
            }
            Place::Owned {
                lines,
                tail,
                corr,
                scales,
            } => Ok(PackedWeights {
                id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
                n: self.n,
                k: self.k,
                lines: Held::Owned(lines),
                tail: Held::Owned(tail),
                corr: Held::Owned(corr),
                scales: Held::Owned(scales),
            }),
        }
    }
}

/// The first `range.len()` bytes of `bytes` (which start at `offset` of a builder's memory) as
/// values of `T`; refused unless aligned for `T` (the layout places every array on 64 bytes).
fn typed<'b, T: bytemuck::Pod>(
    bytes: &'b mut [u8],
    range: &Range<usize>,
    offset: usize,
) -> Result<&'b mut [T], Error> {
    bytemuck::try_cast_slice_mut(&mut bytes[..range.len()]).map_err(|_| Error::Misaligned {
        what: "a packed weight being built",
        offset,
        align: align_of::<T>(),
    })
}

/// Bytes that packed weights may borrow instead of owning: a memory-mapped file, or a buffer one
/// layer was read into. Held by every handle that borrows from it.
pub type SharedBytes = Arc<dyn AsRef<[u8]> + Send + Sync>;

/// One array of a handle: owned, or a typed view into [`SharedBytes`].
enum Held<T> {
    Owned(Vec<T>),
    Shared {
        bytes: SharedBytes,
        start: usize,
        len: usize,
    },
}

impl<T: bytemuck::Pod> Held<T> {
    fn get(&self) -> &[T] {
        match self {
            Held::Owned(v) => v,
            Held::Shared { bytes, start, len } => bytemuck::cast_slice(
                &AsRef::<[u8]>::as_ref(&**bytes)[*start..*start + len * size_of::<T>()],
            ),
        }
    }

    /// `range` of `bytes` as `len` values of `T`, refused unless it is exactly that long, inside
    /// `bytes` and aligned for `T`.
    fn shared(
        what: &'static str,
        bytes: &SharedBytes,
        range: Range<usize>,
        len: usize,
    ) -> Result<Self, Error> {
        let all = AsRef::<[u8]>::as_ref(&**bytes);
        let got = range.end.saturating_sub(range.start);
        if range.end > all.len() || got != len * size_of::<T>() {
            return Err(Error::Shape {
                what,
                got,
                expected: len * size_of::<T>(),
            });
        }
        let address = all.as_ptr() as usize + range.start;
        if !address.is_multiple_of(align_of::<T>()) {
            return Err(Error::Misaligned {
                what,
                offset: range.start,
                align: align_of::<T>(),
            });
        }
        Ok(Held::Shared {
            bytes: bytes.clone(),
            start: range.start,
            len,
        })
    }
}

/// A handle's arrays as raw bytes (host byte order), in the order [`PackedWeights::from_shared`]
/// takes them back: lines, tail, corr, scales.
pub struct PackedParts<'a> {
    pub n: usize,
    pub k: usize,
    /// Each array with the alignment its start needs.
    pub arrays: [(&'a [u8], usize); 4],
}

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// Weights `N × K` (row n = output channel n), quantized per row and packed for the kernels.
///
/// Each handle has a process-unique [`id`](Self::id) so a device backend can cache its own upload.
pub struct PackedWeights {
    id: u64,
    n: usize,
    k: usize,
    lines: Held<Line>,
    tail: Held<i8>,
    corr: Held<i32>,
    scales: Held<f32>,
}

impl std::fmt::Debug for PackedWeights {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PackedWeights")
            .field("id", &self.id)
            .field("n", &self.n)
            .field("k", &self.k)
            .finish()
    }
}

impl PackedWeights {
    /// Quantize `w` (`n × k`, row-major, row = output channel) and pack it.
    ///
    /// Refuses a non-finite element (naming operand B, its row and column) and `k > 131071`.
    pub fn new(w: &[f32], n: usize, k: usize) -> Result<Self, Error> {
        Ok(Self::from_quantized(&quantize(Operand::B, w, n, k)?))
    }

    /// Pack rows that are already quantized (the per-call path for an activation operand).
    pub fn from_quantized(b: &Quantized) -> Self {
        let (n, k) = (b.rows(), b.k());
        let (panels, groups) = (n.div_ceil(PANEL), k / 4);
        let mut lines = vec![Line([0; 64]); panels * groups];
        let mut corr = vec![0i32; panels * PANEL];
        let mut tail = vec![0i8; n * (k % 4)];
        pack_rows(b, 0, panels, &mut lines, &mut corr, &mut tail);
        Self {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            n,
            k,
            lines: Held::Owned(lines),
            tail: Held::Owned(tail),
            corr: Held::Owned(corr),
            scales: Held::Owned(b.scales().to_vec()),
        }
    }

    /// The arrays as raw bytes, for writing them where [`PackedWeights::from_shared`] reads them
    /// back without a copy.
    pub fn parts(&self) -> PackedParts<'_> {
        PackedParts {
            n: self.n,
            k: self.k,
            arrays: [
                (bytemuck::cast_slice(self.lines()), align_of::<Line>()),
                (bytemuck::cast_slice(self.tail()), 1),
                (bytemuck::cast_slice(self.corr()), 4),
                (bytemuck::cast_slice(self.scales()), 4),
            ],
        }
    }

    /// A handle over arrays that [`PackedWeights::parts`] wrote into `bytes` at `ranges` (lines,
    /// tail, corr, scales), borrowed, not copied. Refused unless each range has the length an
    /// `n × k` handle needs and the alignment its values need. The values are taken as they are:
    /// whoever wrote them vouches for them (a shard checks its SHA-256).
    pub fn from_shared(
        n: usize,
        k: usize,
        bytes: &SharedBytes,
        ranges: [Range<usize>; 4],
    ) -> Result<Self, Error> {
        if k > crate::MAX_K {
            return Err(Error::KTooLarge { k });
        }
        let [lines, tail, corr, scales] = ranges;
        let (panels, groups) = (n.div_ceil(PANEL), k / 4);
        Ok(Self {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            n,
            k,
            lines: Held::shared("packed lines", bytes, lines, panels * groups)?,
            tail: Held::shared("packed tail", bytes, tail, n * (k % 4))?,
            corr: Held::shared("packed corrections", bytes, corr, panels * PANEL)?,
            scales: Held::shared("weight scales", bytes, scales, n)?,
        })
    }

    /// Whether the arrays are this handle's own (not borrowed from shared bytes).
    fn is_owned(&self) -> bool {
        matches!(self.lines, Held::Owned(_))
    }

    /// Process-unique identity of this handle.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Output channels.
    pub fn n(&self) -> usize {
        self.n
    }

    /// Row length.
    pub fn k(&self) -> usize {
        self.k
    }

    /// One scale per output channel.
    pub fn scales(&self) -> &[f32] {
        self.scales.get()
    }

    /// Bytes held by this handle.
    pub fn bytes(&self) -> usize {
        self.lines().len() * 64
            + self.tail().len()
            + 4 * self.corr().len()
            + 4 * self.scales().len()
    }

    /// Write row `col` (output channel) as plain i8 values into `out` (length K).
    pub fn write_row(&self, col: usize, out: &mut [i8]) {
        let kmain = self.kmain();
        let (p, c) = (col / PANEL, col % PANEL);
        let (first, stride) = self.line_place(p);
        let lines = self
            .lines()
            .get(first..)
            .unwrap_or_default()
            .iter()
            .step_by(stride);
        for (quad, line) in out[..kmain].chunks_exact_mut(4).zip(lines) {
            let [x, y, z, w] = [
                line.0[4 * c],
                line.0[4 * c + 1],
                line.0[4 * c + 2],
                line.0[4 * c + 3],
            ];
            quad.copy_from_slice(&[x, y, z, w]);
        }
        let rest = self.k - kmain;
        out[kmain..].copy_from_slice(&self.tail()[col * rest..(col + 1) * rest]);
    }

    /// `Σ_k qa[k] · qb[16p + c][k]` for the 16 columns `c` of panel `p` (0 past N): the scalar
    /// reference over the packed layout, in plain loops (each line read once for all 16 columns,
    /// which is what an audit of several cells of one panel needs).
    pub(crate) fn panel_sums(&self, p: usize, qa: &[i8]) -> [i32; PANEL] {
        let kmain = self.kmain();
        let (first, stride) = self.line_place(p);
        let lines = self.lines().get(first..).unwrap_or_default();
        let mut sums = panel_sums(lines, stride, &qa[..kmain]);
        let rest = self.k - kmain;
        if rest > 0 {
            let tail = self.tail();
            for (c, sum) in sums.iter_mut().enumerate() {
                let col = p * PANEL + c;
                if col >= self.n {
                    break;
                }
                let qb = &tail[col * rest..(col + 1) * rest];
                *sum += crate::reference_cell(&qa[kmain..], qb);
            }
        }
        sums
    }

    /// The weights as plain row-major i8 (`n × k`) and their scales, for a backend that uploads its
    /// own layout.
    pub fn to_quantized(&self) -> Quantized {
        let mut q = vec![0i8; self.n * self.k];
        if self.k > 0 {
            for (col, row) in q.chunks_exact_mut(self.k).enumerate() {
                self.write_row(col, row);
            }
        }
        Quantized::from_raw(self.n, self.k, q, self.scales().to_vec())
    }

    /// The part of K held in 4-wide groups.
    pub(crate) fn kmain(&self) -> usize {
        self.k - self.k % 4
    }

    pub(crate) fn groups(&self) -> usize {
        self.k / 4
    }

    pub(crate) fn panels(&self) -> usize {
        self.n.div_ceil(PANEL)
    }

    /// Where panel `p`'s lines are: the index of its group-0 line and the distance between
    /// consecutive groups (the number of panels in its block).
    pub(crate) fn line_place(&self, p: usize) -> (usize, usize) {
        line_place(self.panels(), self.groups(), p)
    }

    pub(crate) fn lines(&self) -> &[Line] {
        self.lines.get()
    }

    /// The shared bytes the lines lie in, where they are not this handle's own.
    pub(crate) fn lines_owner(&self) -> Option<SharedBytes> {
        match &self.lines {
            Held::Owned(_) => None,
            Held::Shared { bytes, .. } => Some(bytes.clone()),
        }
    }

    /// Row-major `n × (k mod 4)` leftover values.
    pub(crate) fn tail(&self) -> &[i8] {
        self.tail.get()
    }

    /// `128 · Σ_{k < kmain} qb[n][k]`, padded with zeros to whole panels.
    pub(crate) fn corr(&self) -> &[i32] {
        self.corr.get()
    }
}

/// [`PackedWeights::panel_sums`] over the grouped part of K: `lines` from the panel's group-0
/// line, group g's line `stride` lines on; `qa` the grouped part of A's row.
fn panel_sums(lines: &[Line], stride: usize, qa: &[i8]) -> [i32; PANEL] {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: AVX2 was detected just above.
        return unsafe { panel_sums_avx2(lines, stride, qa) };
    }
    let mut sums = [0i32; PANEL];
    for (quad, line) in qa.chunks_exact(4).zip(lines.iter().step_by(stride)) {
        for (sum, b) in sums.iter_mut().zip(line.0.chunks_exact(4)) {
            *sum += quad
                .iter()
                .zip(b)
                .map(|(&x, &y)| i32::from(x) * i32::from(y))
                .sum::<i32>();
        }
    }
    sums
}

/// [`panel_sums`] with AVX2: a line's 64 bytes widened to i16 and multiplied by A's four values
/// (repeated) in `vpmaddwd`, so that each i32 lane sums two of a channel's four products; a
/// channel's sum is its two lanes' at the end. (The compiler made the plain loop `vpmulld` on
/// bytes shuffled into place, three times the operations: the audit after every decode product
/// spent 3 % of a token there.) A lane is at most `127² · K / 2 < 2³¹`, exact as the cell is.
///
/// # Safety
/// The CPU must support avx2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn panel_sums_avx2(lines: &[Line], stride: usize, qa: &[i8]) -> [i32; PANEL] {
    use std::arch::x86_64::*;
    let mut acc = [_mm256_setzero_si256(); 4];
    for (quad, line) in qa.chunks_exact(4).zip(lines.iter().step_by(stride)) {
        let q = i32::from_le_bytes([quad[0], quad[1], quad[2], quad[3]].map(|v| v as u8));
        let q = _mm256_broadcastq_epi64(_mm_cvtepi8_epi16(_mm_cvtsi32_si128(q)));
        for (h, acc) in acc.iter_mut().enumerate() {
            // SAFETY: a line is 64 bytes; this reads its bytes 16h .. 16h + 16.
            let b = unsafe { _mm_loadu_si128(line.0.as_ptr().add(16 * h).cast()) };
            *acc = _mm256_add_epi32(*acc, _mm256_madd_epi16(_mm256_cvtepi8_epi16(b), q));
        }
    }
    let mut halves = [0i32; 2 * PANEL];
    for (h, acc) in acc.iter().enumerate() {
        // SAFETY: `halves` holds 32 i32; this writes 8 of them.
        unsafe { _mm256_storeu_si256(halves.as_mut_ptr().add(8 * h).cast(), *acc) };
    }
    std::array::from_fn(|c| halves[2 * c] + halves[2 * c + 1])
}

/// [`PackedWeights::line_place`] for `panels` panels of `groups` groups.
fn line_place(panels: usize, groups: usize, p: usize) -> (usize, usize) {
    let block = p / NP;
    let width = NP.min(panels - block * NP);
    (block * NP * groups + p % NP, width)
}

/// Memory that weights read on every token move into: one reservation of address space that the
/// OS is asked to back with 2 MiB pages, filled front to back as handles arrive
/// ([`WeightArena::take`]). A decode pass streams every weight once per token: in 4 KiB pages that
/// is a TLB miss, and a stop of the hardware prefetcher, every 4 KiB. Only what is written becomes
/// resident (plus the rest of the last 2 MiB page).
pub struct WeightArena {
    block: Arc<Reservation>,
    used: usize,
}

impl WeightArena {
    /// A reservation as large as this machine's memory (address space only), or `None` where the
    /// OS refuses one (strict overcommit) or is not Linux: the handles then keep their own arrays.
    pub fn new() -> Option<Self> {
        Reservation::new().map(|block| Self {
            block: Arc::new(block),
            used: 0,
        })
    }

    /// Move `w`'s arrays to the end of the arena and let `w` borrow them from there (its id and
    /// values unchanged; its own arrays are freed). A handle that already borrows (from a mapped
    /// shard) stays where it is, and so does one that no longer fits.
    pub fn take(&mut self, w: &mut PackedWeights) -> Result<(), Error> {
        if !w.is_owned() {
            return Ok(());
        }
        let place = |len: usize| len.next_multiple_of(64);
        let parts = w.parts();
        let len: usize = parts.arrays.iter().map(|(b, _)| place(b.len())).sum();
        if len > self.block.len - self.used {
            return Ok(());
        }
        let start = self.used;
        let mut ranges: [Range<usize>; 4] = Default::default();
        let mut at = 0;
        for (range, (bytes, _)) in ranges.iter_mut().zip(parts.arrays) {
            // SAFETY: [start + at, start + at + bytes.len()) lies inside the reservation, past
            // every byte handed out before (`used`), so nothing refers to it yet; `bytes` is
            // `w`'s own memory, not the reservation's.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    bytes.as_ptr(),
                    self.block.start.add(start + at),
                    bytes.len(),
                );
            }
            *range = at..at + bytes.len();
            at += place(bytes.len());
        }
        self.used += len;
        let shared: SharedBytes = Arc::new(ArenaPart {
            block: self.block.clone(),
            start,
            len,
        });
        let moved = PackedWeights::from_shared(w.n, w.k, &shared, ranges)?;
        *w = PackedWeights { id: w.id, ..moved };
        Ok(())
    }

    /// Bytes handed out so far.
    pub fn used(&self) -> usize {
        self.used
    }
}

/// The part of a [`WeightArena`] one handle's arrays were written to.
struct ArenaPart {
    block: Arc<Reservation>,
    start: usize,
    len: usize,
}

impl AsRef<[u8]> for ArenaPart {
    fn as_ref(&self) -> &[u8] {
        // SAFETY: the part lies inside the reservation and was written whole before this value
        // existed; the arena never writes it again.
        unsafe { std::slice::from_raw_parts(self.block.start.add(self.start), self.len) }
    }
}

/// Address space reserved without being committed, its start on a 2 MiB boundary, with the
/// kernel asked for transparent huge pages.
struct Reservation {
    base: *mut u8,
    map_len: usize,
    start: *mut u8,
    len: usize,
}

// SAFETY: the reservation is plain memory owned by this value; parts are written once, before any
// reference to them exists (see `WeightArena::take`), and only read afterwards.
unsafe impl Send for Reservation {}
// SAFETY: as above.
unsafe impl Sync for Reservation {}

/// The size of a transparent huge page on x86-64 (and most arm64 kernels).
const HUGE_PAGE: usize = 2 << 20;

impl Reservation {
    /// As much address space as this machine has memory; none under strict overcommit
    /// (`vm.overcommit_memory = 2`), where a reservation is counted as committed memory even with
    /// `MAP_NORESERVE` and would take what later allocations need.
    #[cfg(target_os = "linux")]
    fn new() -> Option<Self> {
        let strict = std::fs::read_to_string("/proc/sys/vm/overcommit_memory")
            .is_ok_and(|mode| mode.trim() == "2");
        if strict {
            return None;
        }
        // SAFETY: sysconf only reads system parameters.
        let (pages, page) = unsafe {
            (
                libc::sysconf(libc::_SC_PHYS_PAGES),
                libc::sysconf(libc::_SC_PAGESIZE),
            )
        };
        let memory = usize::try_from(pages)
            .ok()?
            .checked_mul(usize::try_from(page).ok()?)?;
        Self::with_len(memory)
    }

    #[cfg(not(target_os = "linux"))]
    fn new() -> Option<Self> {
        None
    }

    /// `len` bytes (rounded up to whole huge pages) of address space, zero until written.
    #[cfg(target_os = "linux")]
    fn with_len(len: usize) -> Option<Self> {
        let len = len.max(1).next_multiple_of(HUGE_PAGE);
        let map_len = len.checked_add(HUGE_PAGE)?;
        // SAFETY: a fresh private anonymous mapping that nothing else refers to; NORESERVE:
        // address space only, pages are committed as they are written.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                map_len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return None;
        }
        let start = (base as usize).next_multiple_of(HUGE_PAGE) as *mut u8;
        // SAFETY: [start, start + len) lies inside the mapping; the advice changes only how its
        // pages are served (nothing where huge pages are off).
        unsafe { libc::madvise(start.cast(), len, libc::MADV_HUGEPAGE) };
        Some(Self {
            base: base.cast(),
            map_len,
            start,
            len,
        })
    }

    #[cfg(not(target_os = "linux"))]
    fn with_len(_len: usize) -> Option<Self> {
        None
    }
}

/// Zeroed bytes of this process in memory that the OS is asked to back with 2 MiB pages (a shard's
/// layers read from its file: decode streams them on every token), on a 2 MiB boundary.
pub struct HugeBytes {
    block: Reservation,
    len: usize,
}

impl HugeBytes {
    /// `len` zero bytes, or `None` where such memory cannot be had (not Linux, or the OS refuses
    /// the mapping).
    pub fn zeroed(len: usize) -> Option<Self> {
        Reservation::with_len(len).map(|block| Self { block, len })
    }
}

impl AsRef<[u8]> for HugeBytes {
    fn as_ref(&self) -> &[u8] {
        // SAFETY: `len` bytes from `start` lie inside the mapping this value owns.
        unsafe { std::slice::from_raw_parts(self.block.start, self.len) }
    }
}

impl AsMut<[u8]> for HugeBytes {
    fn as_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `as_ref`, through the one `&mut` to this value.
        unsafe { std::slice::from_raw_parts_mut(self.block.start, self.len) }
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        #[cfg(target_os = "linux")]
        // SAFETY: the mapping made in `new`, unmapped once, after the last part that borrows it.
        unsafe {
            libc::munmap(self.base.cast(), self.map_len);
        }
        #[cfg(not(target_os = "linux"))]
        let _ = (self.base, self.map_len);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The audit's reference sums over the packed layout (`vpmaddwd` on widened bytes where AVX2
    /// runs) against exact i64 sums of the plain rows: random values, and ±127 meeting ±127 at the
    /// largest K (each lane's half sum at its largest), across whole and cut panels and K with a
    /// leftover; its mutation, one weight changed, must move its column's sum.
    #[test]
    fn panel_sums_equal_the_exact_sums_of_the_rows() {
        let mut state = 0x5EED_5A35u64;
        let mut next = move || crate::verify::splitmix(&mut state);
        for (n, k, extremes) in [
            (40, 7, false),
            (16, 64, false),
            (33, 1027, false),
            (17, 131_071, true),
        ] {
            let value = |r: usize, j: usize, x: u64| -> i8 {
                if extremes {
                    if (r + j / 3).is_multiple_of(2) {
                        127
                    } else {
                        -127
                    }
                } else {
                    ((x % 255) as i32 - 127) as i8
                }
            };
            let qb: Vec<i8> = (0..n * k).map(|i| value(i / k, i % k, next())).collect();
            let qa: Vec<i8> = (0..k).map(|j| value(0, j, next())).collect();
            let w = PackedWeights::from_quantized(
                &Quantized::from_parts(n, k, qb.clone(), vec![1.0; n]).unwrap(),
            );
            for p in 0..w.panels() {
                let sums = w.panel_sums(p, &qa);
                for (c, &got) in sums.iter().enumerate() {
                    let col = p * PANEL + c;
                    let want: i64 = if col < n {
                        qa.iter()
                            .zip(&qb[col * k..(col + 1) * k])
                            .map(|(&x, &y)| i64::from(x) * i64::from(y))
                            .sum()
                    } else {
                        0
                    };
                    assert_eq!(i64::from(got), want, "n={n} k={k} column {col}");
                }
            }
            let mut changed = qb.clone();
            let at = (n - 1) * k + k / 2;
            changed[at] = if changed[at] == 0 { 1 } else { -changed[at] };
            let mutant = PackedWeights::from_quantized(
                &Quantized::from_parts(n, k, changed, vec![1.0; n]).unwrap(),
            );
            let p = (n - 1) / PANEL;
            assert_ne!(
                mutant.panel_sums(p, &qa)[(n - 1) % PANEL],
                w.panel_sums(p, &qa)[(n - 1) % PANEL],
                "n={n} k={k}: the mutant's sum must move"
            );
        }
    }

    /// A weight packed block by block, in 2 MiB pages or in owned arrays, is byte for byte the
    /// weight packed whole: whole and cut panels, K with and without a leftover; its mutation, one
    /// row changed in one block, must differ.
    #[test]
    fn a_weight_packed_as_its_rows_come_is_the_weight_packed_whole() {
        let mut state = 0xB10C_5EEDu64;
        let mut next = move || crate::verify::splitmix(&mut state);
        for (n, k, block) in [(40, 7, 16), (33, 1027, 5), (16, 64, 16), (1000, 130, 333)] {
            let q: Vec<i8> = (0..n * k)
                .map(|_| ((next() % 255) as i32 - 127) as i8)
                .collect();
            let scales: Vec<f32> = (0..n).map(|i| 0.5 + i as f32 / 7.0).collect();
            let whole = Quantized::from_parts(n, k, q.clone(), scales.clone()).expect("whole");
            let want = PackedWeights::from_quantized(&whole);
            let bytes = |w: &PackedWeights| -> Vec<Vec<u8>> {
                w.parts().arrays.iter().map(|(b, _)| b.to_vec()).collect()
            };
            for (huge, mutate) in [(true, false), (false, false), (true, true)] {
                let mut b = PackedBuilder::new_in(n, k, huge).expect("room");
                for r0 in (0..n).step_by(block) {
                    let r1 = (r0 + block).min(n);
                    let mut rows = q[r0 * k..r1 * k].to_vec();
                    if mutate && r0 + block >= n {
                        rows[0] = rows[0].wrapping_add(1);
                    }
                    let part = Quantized::from_parts(r1 - r0, k, rows, scales[r0..r1].to_vec())
                        .expect("part");
                    b.push(&part).expect("push");
                }
                let got = b.finish().expect("finish");
                assert_eq!((got.n(), got.k()), (n, k));
                let same = bytes(&got) == bytes(&want);
                assert_eq!(
                    same, !mutate,
                    "{n}x{k} by {block}, huge {huge}, mutated {mutate}"
                );
            }
            // Too few rows, too many, another K: refused.
            assert!(PackedBuilder::new(n, k).expect("room").finish().is_err());
            let mut b = PackedBuilder::new(n, k).expect("room");
            b.push(&whole).expect("all rows");
            assert!(b.push(&whole).is_err());
            let other = Quantized::from_parts(1, k + 1, vec![0; k + 1], vec![1.0]).expect("row");
            assert!(
                PackedBuilder::new(n, k)
                    .expect("room")
                    .push(&other)
                    .is_err()
            );
        }
    }
}
