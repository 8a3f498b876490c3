//! The matrix products of a stage (DESIGN.md §3.6), at one of three precisions.
//!
//! `F32` is the reference: plain f32 products in one fixed order. `Int8` sends every product through
//! the verified GEMM of `daisy-gemm-int8`, with weights held quantized. `Int8x2` (§3.9) carries every
//! operand as two int8 planes, its quantization and the quantization of what that left, and forms
//! each product from three products through the same unit.

use daisy_gemm_int8::{
    Backend, PackedBuilder, PackedWeights, Quantized, Rhs, gemm, gemm_quantized,
    gemm_quantized_batch, leading_reusing, quantize_residual, quantize_rows_reusing, recycle,
};

use smallvec::SmallVec;

use crate::ops::matmul_f32;
use crate::shard::{Put, Take};
use crate::source::{Embedding, Source, read_rows, read_shaped};
use crate::{Error, Result};

/// The precision of every matrix product of a run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
pub enum Precision {
    /// Every GEMM through the verified INT8 unit (the product).
    #[default]
    Int8,
    /// Plain f32 products in one fixed order (the reference).
    F32,
    /// Every operand as two int8 planes and every product as three through the unit (§3.9): about
    /// three times the int8 work and twice its weight bytes, for answers close to f32's.
    Int8x2,
}

impl Precision {
    /// Every precision, in the order `--help` lists them.
    pub const ALL: [Self; 3] = [Self::Int8, Self::Int8x2, Self::F32];

    /// `int8`, `int8x2` or `f32`.
    pub fn parse(name: &str) -> Result<Self> {
        Self::ALL
            .into_iter()
            .find(|p| p.name() == name)
            .ok_or_else(|| {
                Error::Invalid(format!("precision `{name}`, expected int8, int8x2 or f32"))
            })
    }

    /// `int8`, `int8x2` or `f32`.
    pub fn name(self) -> &'static str {
        match self {
            Self::Int8 => "int8",
            Self::F32 => "f32",
            Self::Int8x2 => "int8x2",
        }
    }

    /// Whether products go through the int8 unit (one plane or two).
    pub fn is_int8(self) -> bool {
        self != Self::F32
    }

    /// Whether every operand is carried as two planes.
    pub fn two_planes(self) -> bool {
        self == Self::Int8x2
    }
}

/// What every product of a forward pass runs with.
#[derive(Clone, Copy)]
pub(crate) struct Ctx<'a> {
    pub(crate) precision: Precision,
    pub(crate) backend: &'a dyn Backend,
}

/// A weight matrix `n×k` (row = output channel) as a stage holds it: f32, or int8 with one scale per
/// output channel, quantized once at load.
pub(crate) enum Weight {
    F32(Vec<f32>),
    Int8(PackedWeights),
    /// The two planes of §3.9: the quantized weight, then the quantized residual.
    Int8x2([PackedWeights; 2]),
}

impl Weight {
    /// Packed from one plane (int8) or two (int8x2).
    fn packed((p1, p2): Planes) -> Self {
        let p1 = PackedWeights::from_quantized(&p1);
        match p2 {
            Some(p2) => Self::Int8x2([p1, PackedWeights::from_quantized(&p2)]),
            None => Self::Int8(p1),
        }
    }
}

/// An operand's first plane and, at int8x2, its second.
pub(crate) type Planes = (Quantized, Option<Quantized>);

/// The planes of `rows × k` values at `precision` (int8: one; int8x2: two).
pub(crate) fn planes(
    precision: Precision,
    x: &[f32],
    rows: usize,
    k: usize,
) -> std::result::Result<Planes, daisy_gemm_int8::Error> {
    // Into memory given back by an earlier operand of this thread (see `recycle_planes`).
    let first = quantize_rows_reusing(x, rows, k)?;
    let second = match precision.two_planes() {
        true => Some(quantize_residual(x, &first)?),
        false => None,
    };
    Ok((first, second))
}

/// Give an operand's planes back to this thread's spare buffers once they are used (the token
/// loop then quantizes its activations without allocating).
pub(crate) fn recycle_planes((first, second): Planes) {
    recycle(first);
    if let Some(second) = second {
        recycle(second);
    }
}

/// A weight's planes quantized a block of rows at a time and appended: rows quantize
/// independently, so the blocks are the whole quantized at once, and the whole is never held
/// widened to f32.
struct RowBlocks<'a> {
    precision: Precision,
    n: usize,
    k: usize,
    into: Gathered,
    what: &'a dyn Fn() -> String,
}

/// Where a [`RowBlocks`] puts its rows.
enum Gathered {
    /// Appended quantized, packed at the end (a weight of a layer: the stage then moves it into its
    /// arena with the others).
    Planes(Planes),
    /// Packed as they come into memory of the weight's own (one as large as a tied lm_head
    /// would otherwise be held twice over at load, quantized and packed).
    Packed(PackedBuilder, Option<PackedBuilder>),
}

impl<'a> RowBlocks<'a> {
    /// Room for `n` rows of `k`; `what` names the weight in a refusal.
    fn new(precision: Precision, n: usize, k: usize, what: &'a dyn Fn() -> String) -> Result<Self> {
        let empty = || {
            Quantized::from_parts(0, k, Vec::with_capacity(n * k), Vec::with_capacity(n))
                .map_err(|e| gemm_err(what, e))
        };
        let second = precision.two_planes().then(empty).transpose()?;
        Ok(Self::gathering(
            precision,
            n,
            k,
            what,
            Gathered::Planes((empty()?, second)),
        ))
    }

    /// As [`new`](Self::new), each block packed as it comes ([`Gathered::Packed`]).
    fn packing(
        precision: Precision,
        n: usize,
        k: usize,
        what: &'a dyn Fn() -> String,
    ) -> Result<Self> {
        let builder = || PackedBuilder::new(n, k).map_err(|e| gemm_err(what, e));
        let second = precision.two_planes().then(builder).transpose()?;
        Ok(Self::gathering(
            precision,
            n,
            k,
            what,
            Gathered::Packed(builder()?, second),
        ))
    }

    fn gathering(
        precision: Precision,
        n: usize,
        k: usize,
        what: &'a dyn Fn() -> String,
        into: Gathered,
    ) -> Self {
        Self {
            precision,
            n,
            k,
            into,
            what,
        }
    }

    /// Quantize whole rows `w` and append them.
    fn push(&mut self, w: &[f32]) -> Result<()> {
        let rows = w.len().checked_div(self.k).unwrap_or(0);
        let err = |e| gemm_err(self.what, e);
        let (p1, p2) = planes(self.precision, w, rows, self.k).map_err(err)?;
        match &mut self.into {
            Gathered::Planes((q1, q2)) => {
                q1.append(&p1).map_err(err)?;
                if let (Some(q2), Some(p2)) = (q2, &p2) {
                    q2.append(p2).map_err(err)?;
                }
            }
            Gathered::Packed(b1, b2) => {
                b1.push(&p1).map_err(err)?;
                if let (Some(b2), Some(p2)) = (b2, &p2) {
                    b2.push(p2).map_err(err)?;
                }
            }
        }
        Ok(())
    }

    /// The packed weight, refused unless exactly its `n` rows were pushed.
    fn into_weight(self) -> Result<Weight> {
        let got = match &self.into {
            Gathered::Planes((q1, _)) => q1.rows(),
            Gathered::Packed(b1, _) => b1.rows(),
        };
        if got != self.n {
            return Err(Error::Invalid(format!(
                "{}: {got} rows of {} given for a {}x{} weight",
                (self.what)(),
                self.k,
                self.n,
                self.k
            )));
        }
        let err = |e| gemm_err(self.what, e);
        Ok(match self.into {
            Gathered::Planes(planes) => Weight::packed(planes),
            Gathered::Packed(b1, None) => Weight::Int8(b1.finish().map_err(err)?),
            Gathered::Packed(b1, Some(b2)) => {
                Weight::Int8x2([b1.finish().map_err(err)?, b2.finish().map_err(err)?])
            }
        })
    }
}

/// `C = A·Bᵀ` from the planes of A and of B: `D(A₁,B₁)` with one plane each, or
/// `(D(A₁,B₁) + D(A₂,B₁)) + D(A₁,B₂)` in f32 with two (§3.9), where D is one product through the
/// unit. A₁ and A₂ go through the unit stacked, as one product of twice the rows against B₁.
fn product<'b>(
    backend: &dyn Backend,
    (mut a1, a2): Planes,
    b1: Rhs<'b>,
    b2: Option<Rhs<'b>>,
) -> std::result::Result<Vec<f32>, daisy_gemm_int8::Error> {
    let (Some(a2), Some(b2)) = (a2, b2) else {
        let c = gemm_quantized(backend, &a1, b1);
        recycle(a1);
        return c;
    };
    let cross = gemm_quantized(backend, &a1, b2)?;
    a1.append(&a2)?;
    let mut both = gemm_quantized(backend, &a1, b1)?;
    let cells = cross.len();
    let (d11, d21) = both.split_at_mut(cells);
    for ((c, d21), d12) in d11.iter_mut().zip(&*d21).zip(&cross) {
        *c = (*c + d21) + d12;
    }
    both.truncate(cells);
    Ok(both)
}

pub(crate) fn gemm_err(what: &dyn Fn() -> String, e: daisy_gemm_int8::Error) -> Error {
    Error::Gemm {
        what: what(),
        reason: e.to_string(),
    }
}

/// `y = x·Wᵀ (+ b)`.
pub(crate) struct Linear {
    weight: Weight,
    n: usize,
    k: usize,
    bias: Option<Vec<f32>>,
}

impl Linear {
    /// From an `n×k` weight in f32 (consumed) and an optional bias of `n`.
    pub(crate) fn new(
        precision: Precision,
        w: Vec<f32>,
        n: usize,
        k: usize,
        bias: Option<Vec<f32>>,
    ) -> Result<Self> {
        let weight = match precision {
            Precision::F32 => Weight::F32(w),
            Precision::Int8 | Precision::Int8x2 => {
                let what = || format!("quantizing a {n}x{k} weight");
                let mut blocks = RowBlocks::new(precision, n, k, &what)?;
                blocks.push(&w)?;
                blocks.into_weight()?
            }
        };
        Ok(Self { weight, n, k, bias })
    }

    /// One `n × k` weight stacked from the tensors `parts` (`(name, rows)`, each `rows × k`, in
    /// order: q, k and v, or gate and up, or one tensor alone), plus an optional bias. At int8 the
    /// rows are quantized a block at a time as they are widened (`read_rows`) — rows quantize
    /// independently, so the bits are those of quantizing the stacked whole — so no tensor is ever
    /// held widened to f32, only its stored bytes: the load's peak is the weights held so far plus
    /// one tensor as stored and the quantized rows of this weight.
    pub(crate) fn stacked(
        precision: Precision,
        src: &dyn Source,
        parts: &[(String, usize)],
        k: usize,
        bias: Option<Vec<f32>>,
    ) -> Result<Self> {
        let n: usize = parts.iter().map(|p| p.1).sum();
        if precision == Precision::F32 {
            let mut w = Vec::with_capacity(n * k);
            for (name, rows) in parts {
                w.extend(read_shaped(src, name, &[*rows, k])?);
            }
            return Ok(Self {
                weight: Weight::F32(w),
                n,
                k,
                bias,
            });
        }
        let what = || format!("quantizing a {n}x{k} weight");
        let mut blocks = RowBlocks::new(precision, n, k, &what)?;
        for (name, rows) in parts {
            read_rows(src, name, *rows, k, &mut |w: &[f32]| blocks.push(w))?;
        }
        Ok(Self {
            weight: blocks.into_weight()?,
            n,
            k,
            bias,
        })
    }

    /// A tied lm_head: the embedding table as the weight. The int8 copy is quantized a block of rows
    /// at a time (rows quantize independently, so the bits are those of quantizing the whole table),
    /// so the table is never held widened to f32 in full.
    pub(crate) fn tied(
        precision: Precision,
        embed: &Embedding,
        n: usize,
        k: usize,
    ) -> Result<Self> {
        let weight = match precision {
            Precision::F32 => {
                let w = embed.to_f32();
                embed.release(0, n);
                Weight::F32(w)
            }
            Precision::Int8 | Precision::Int8x2 => {
                const BLOCK: usize = 1024;
                let what = || format!("quantizing the tied {n}x{k} lm_head");
                let mut blocks = RowBlocks::packing(precision, n, k, &what)?;
                let mut rows = Vec::with_capacity(BLOCK * k);
                for r0 in (0..n).step_by(BLOCK) {
                    let r1 = (r0 + BLOCK).min(n);
                    rows.clear();
                    for r in r0..r1 {
                        embed.row_into(r, &mut rows);
                    }
                    // A mapped table's pages, once quantized, are not kept resident for it.
                    embed.release(r0, r1);
                    blocks.push(&rows)?;
                }
                // And the pages the kernel mapped around the blocks' edges (1.3 MB of SmolLM2's
                // table stayed resident without this): lookups read rows from the file, so nothing
                // of the table is resident once the lm_head is made.
                embed.release(0, n);
                blocks.into_weight()?
            }
        };
        Ok(Self {
            weight,
            n,
            k,
            bias: None,
        })
    }

    /// The weight as held (int8 values and scales, or f32) and the bias, for a shard.
    pub(crate) fn write(&self, put: &mut Put<'_>) {
        put.u64(self.n as u64);
        put.u64(self.k as u64);
        match &self.weight {
            Weight::F32(w) => {
                put.u8(0);
                put.f32s(w);
            }
            Weight::Int8(p) => {
                put.u8(1);
                put.packed(p);
            }
            Weight::Int8x2([p1, p2]) => {
                put.u8(2);
                put.packed(p1);
                put.packed(p2);
            }
        }
        match &self.bias {
            None => put.u8(0),
            Some(b) => {
                put.u8(1);
                put.f32s(b);
            }
        }
    }

    /// What [`Linear::write`] wrote, refused unless it is `n×k` at `precision`; int8 arrays are
    /// borrowed where they lie (the shard's hash vouches for their values).
    pub(crate) fn read(
        take: &mut Take<'_>,
        precision: Precision,
        n: usize,
        k: usize,
    ) -> Result<Self> {
        let bad = |why: String| Error::Invalid(format!("a shard's {n}x{k} weight: {why}"));
        let (got_n, got_k) = (take.u64()? as usize, take.u64()? as usize);
        if (got_n, got_k) != (n, k) {
            return Err(bad(format!("it is {got_n}x{got_k}")));
        }
        let weight = match (take.u8()?, precision) {
            (0, Precision::F32) => {
                let w = take.f32s()?;
                if w.len() != n * k {
                    return Err(bad(format!("{} values", w.len())));
                }
                Weight::F32(w)
            }
            (1, Precision::Int8) => Weight::Int8(take.packed(n, k)?),
            (2, Precision::Int8x2) => Weight::Int8x2([take.packed(n, k)?, take.packed(n, k)?]),
            (tag, _) => {
                let held = match tag {
                    0 => "f32",
                    1 => "int8",
                    2 => "int8x2",
                    _ => "an unknown precision",
                };
                return Err(bad(format!(
                    "held as {held}, the stage runs {}",
                    precision.name()
                )));
            }
        };
        let bias = match take.u8()? {
            0 => None,
            _ => {
                let b = take.f32s()?;
                if b.len() != n {
                    return Err(bad(format!("a bias of {}", b.len())));
                }
                Some(b)
            }
        };
        Ok(Self { weight, n, k, bias })
    }

    /// Ask the GEMM's idle worker to bring the weight towards the caches (int8; a hint).
    pub(crate) fn prefetch(&self) {
        if let Weight::Int8(p) = &self.weight {
            daisy_gemm_int8::prefetch(p);
        }
    }

    /// The weight at int8 (one plane), if it is held so.
    pub(crate) fn int8(&self) -> Option<&PackedWeights> {
        match &self.weight {
            Weight::Int8(p) => Some(p),
            Weight::F32(_) | Weight::Int8x2(_) => None,
        }
    }

    /// The int8 planes of the weight, to move (none at f32).
    pub(crate) fn planes_mut(&mut self) -> Vec<&mut PackedWeights> {
        match &mut self.weight {
            Weight::F32(_) => Vec::new(),
            Weight::Int8(p) => vec![p],
            Weight::Int8x2([p1, p2]) => vec![p1, p2],
        }
    }

    /// The bias, if the product has one.
    pub(crate) fn bias(&self) -> Option<&[f32]> {
        self.bias.as_deref()
    }

    /// The int8 planes of the weight (none at f32).
    pub(crate) fn planes(&self) -> Vec<&PackedWeights> {
        match &self.weight {
            Weight::F32(_) => Vec::new(),
            Weight::Int8(p) => vec![p],
            Weight::Int8x2([p1, p2]) => vec![p1, p2],
        }
    }

    /// Bytes held by the weight and bias.
    pub(crate) fn bytes(&self) -> usize {
        let w = match &self.weight {
            Weight::F32(w) => w.len() * 4,
            Weight::Int8(p) => p.bytes(),
            Weight::Int8x2([p1, p2]) => p1.bytes() + p2.bytes(),
        };
        w + self.bias.as_ref().map_or(0, |b| b.len() * 4)
    }

    /// `t` rows of `x` (each `k` wide) times the weight, plus the bias; `what` names the layer for errors.
    pub(crate) fn forward(
        &self,
        cx: Ctx<'_>,
        x: &[f32],
        t: usize,
        what: &dyn Fn() -> String,
    ) -> Result<Vec<f32>> {
        let mut y = match &self.weight {
            Weight::F32(w) => matmul_f32(x, t, w, self.n, self.k),
            Weight::Int8(p) => gemm(cx.backend, x, t, p).map_err(|e| gemm_err(what, e))?,
            Weight::Int8x2(w) => {
                let a = planes(cx.precision, x, t, self.k).map_err(|e| gemm_err(what, e))?;
                product(
                    cx.backend,
                    a,
                    Rhs::Weights(&w[0]),
                    Some(Rhs::Weights(&w[1])),
                )
                .map_err(|e| gemm_err(what, e))?
            }
        };
        if let Some(b) = &self.bias {
            for row in y.chunks_exact_mut(self.n) {
                for (v, b) in row.iter_mut().zip(b) {
                    *v += b;
                }
            }
        }
        Ok(y)
    }
}

/// The B operand of an attention product (`n×k`: K rows, or Vᵀ rows), prepared once for every
/// query head that shares it.
pub(crate) enum ActRhs<'a> {
    F32 {
        b: &'a [f32],
        n: usize,
        k: usize,
    },
    /// Its planes, quantized for this call (Vᵀ), or borrowed from the key cache.
    Int8Owned(Planes),
    Int8(&'a Quantized, Option<&'a Quantized>),
}

impl ActRhs<'_> {
    /// Its first `n` rows, each cut to its first `k` values and keeping its whole row's scale
    /// ([`daisy_gemm_int8::leading_reusing`]): the operand of a product whose A is zero past
    /// column `k`. Only int8 planes are cut (an f32 operand is refused).
    pub(crate) fn leading(
        &self,
        n: usize,
        k: usize,
    ) -> std::result::Result<ActRhs<'static>, daisy_gemm_int8::Error> {
        let (b1, b2) = match self {
            ActRhs::Int8Owned((b1, b2)) => (b1, b2.as_ref()),
            ActRhs::Int8(b1, b2) => (*b1, *b2),
            ActRhs::F32 { n: rows, .. } => {
                return Err(daisy_gemm_int8::Error::Shape {
                    what: "an f32 operand cut to its leading corner",
                    got: n,
                    expected: *rows,
                });
            }
        };
        let first = leading_reusing(b1, n, k)?;
        let second = b2.map(|b2| leading_reusing(b2, n, k)).transpose()?;
        Ok(ActRhs::Int8Owned((first, second)))
    }

    /// Give the planes this operand owns back to the thread's spare buffers.
    pub(crate) fn recycle(self) {
        if let ActRhs::Int8Owned(planes) = self {
            recycle_planes(planes);
        }
    }
}

/// `b` (`n×k`) as the B operand at the context's precision: its planes for int8 and int8x2.
pub(crate) fn act_rhs<'a>(
    cx: Ctx<'_>,
    b: &'a [f32],
    n: usize,
    k: usize,
    what: &dyn Fn() -> String,
) -> Result<ActRhs<'a>> {
    match cx.precision {
        Precision::F32 => Ok(ActRhs::F32 { b, n, k }),
        Precision::Int8 | Precision::Int8x2 => planes(cx.precision, b, n, k)
            .map(ActRhs::Int8Owned)
            .map_err(|e| gemm_err(what, e)),
    }
}

/// Quantize `t` new key rows (`k` wide) and append their planes to a quantized key cache (`second`
/// at int8x2).
pub(crate) fn quantize_keys(
    precision: Precision,
    rows: &[f32],
    t: usize,
    k: usize,
    (first, second): (&mut Quantized, Option<&mut Quantized>),
    what: &dyn Fn() -> String,
) -> Result<()> {
    let (p1, p2) = planes(precision, rows, t, k).map_err(|e| gemm_err(what, e))?;
    first.append(&p1).map_err(|e| gemm_err(what, e))?;
    let appended = match (second, &p2) {
        (Some(cache), Some(p2)) => cache.append(p2).map_err(|e| gemm_err(what, e)),
        (None, None) => Ok(()),
        _ => Err(Error::Invalid(format!(
            "{}: the key cache holds other planes than {} makes",
            what(),
            precision.name()
        ))),
    };
    recycle_planes((p1, p2));
    appended
}

/// `C = A·Bᵀ` for an activation A (`t×k`) and a prepared activation B (attention scores and
/// attention × values).
pub(crate) fn act_gemm_rhs(
    cx: Ctx<'_>,
    a: &[f32],
    t: usize,
    b: &ActRhs<'_>,
    what: &dyn Fn() -> String,
) -> Result<Vec<f32>> {
    let (b1, b2) = match b {
        ActRhs::F32 { b, n, k } => return Ok(matmul_f32(a, t, b, *n, *k)),
        ActRhs::Int8Owned((b1, b2)) => (b1, b2.as_ref()),
        ActRhs::Int8(b1, b2) => (*b1, *b2),
    };
    let a = planes(cx.precision, a, t, b1.k()).map_err(|e| gemm_err(what, e))?;
    product(cx.backend, a, Rhs::Activation(b1), b2.map(Rhs::Activation))
        .map_err(|e| gemm_err(what, e))
}

/// [`act_gemm_rhs`] for several independent products (the kv-head groups of one attention call):
/// at int8 they go to the backend as one batch (one round trip on a device); the cells are those of
/// each product alone.
pub(crate) fn act_gemm_batch(
    cx: Ctx<'_>,
    jobs: &[(&[f32], usize, &ActRhs<'_>)],
    what: &dyn Fn() -> String,
) -> Result<Vec<Vec<f32>>> {
    let single: Option<SmallVec<[&Quantized; 8]>> = match cx.precision {
        Precision::Int8 => jobs
            .iter()
            .map(|(_, _, b)| match b {
                ActRhs::Int8Owned((b1, None)) => Some(b1),
                ActRhs::Int8(b1, None) => Some(*b1),
                _ => None,
            })
            .collect(),
        Precision::F32 | Precision::Int8x2 => None,
    };
    let Some(bs) = single.filter(|bs| bs.len() > 1) else {
        return jobs
            .iter()
            .map(|(a, t, b)| act_gemm_rhs(cx, a, *t, b, what))
            .collect();
    };
    let quantized: SmallVec<[Quantized; 8]> = jobs
        .iter()
        .zip(&bs)
        .map(|((a, t, _), b)| quantize_rows_reusing(a, *t, b.k()))
        .collect::<std::result::Result<_, _>>()
        .map_err(|e| gemm_err(what, e))?;
    let pairs: SmallVec<[(&Quantized, Rhs<'_>); 8]> = quantized
        .iter()
        .zip(&bs)
        .map(|(a, b)| (a, Rhs::Activation(b)))
        .collect();
    let outs = gemm_quantized_batch(cx.backend, &pairs).map_err(|e| gemm_err(what, e));
    drop(pairs);
    quantized.into_iter().for_each(recycle);
    outs
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use daisy_loader::DType;

    use super::*;
    use crate::source::RawTensor;

    /// Tensors held in memory, as stored (BF16 here).
    struct Tensors(HashMap<String, RawTensor>);

    impl Source for Tensors {
        fn read_f32(&self, name: &str) -> Result<(Vec<usize>, Vec<f32>)> {
            let (shape, dtype, bytes) = self.read_raw(name)?.expect("held");
            let values = daisy_loader::widen(dtype, &bytes);
            daisy_loader::check_finite(name, &values)?;
            Ok((shape, values))
        }
        fn read_raw(&self, name: &str) -> Result<Option<RawTensor>> {
            self.0
                .get(name)
                .cloned()
                .map(Some)
                .ok_or_else(|| Error::Loader(daisy_loader::Error::NoSuchTensor(name.to_string())))
        }
        fn has(&self, name: &str) -> bool {
            self.0.contains_key(name)
        }
        fn fingerprint(&self) -> [u8; 32] {
            [0; 32]
        }
    }

    /// `rows × k` seeded values (row magnitudes spread, so scales differ) stored as BF16.
    fn tensor(seed: u64, rows: usize, k: usize) -> (Vec<f32>, RawTensor) {
        let values = daisy_gemm_int8::seeded_matrix(seed, rows, k);
        let bits: Vec<u16> = values
            .iter()
            .map(|&v| daisy_loader::bf16_from_f32(v))
            .collect();
        let widened = bits.iter().map(|&b| daisy_loader::widen_bf16(b)).collect();
        let bytes = bits.iter().flat_map(|b| b.to_le_bytes()).collect();
        (widened, (vec![rows, k], DType::BF16, bytes))
    }

    fn held(w: &Linear) -> Vec<(Vec<i8>, Vec<f32>)> {
        w.planes()
            .iter()
            .map(|p| {
                let q = p.to_quantized();
                (q.q().to_vec(), q.scales().to_vec())
            })
            .collect()
    }

    #[test]
    fn a_weight_stacked_a_block_of_rows_at_a_time_is_the_whole_quantized_at_once() {
        // 700 rows of 576 span two blocks of rows (455 a block), the second part one more.
        let k = 576;
        let (a, raw_a) = tensor(1, 700, k);
        let (b, raw_b) = tensor(2, 300, k);
        let src = Tensors(HashMap::from([("a".into(), raw_a), ("b".into(), raw_b)]));
        let parts = [("a".to_string(), 700), ("b".to_string(), 300)];
        let whole: Vec<f32> = a.iter().chain(&b).copied().collect();
        for precision in [Precision::Int8, Precision::Int8x2] {
            let stacked = Linear::stacked(precision, &src, &parts, k, None).unwrap();
            let at_once = Linear::new(precision, whole.clone(), 1000, k, None).unwrap();
            assert_eq!(held(&stacked), held(&at_once), "{}", precision.name());
            // Mutation: one value of the second block changed gives other bits.
            let mut changed = whole.clone();
            changed[600 * k + 5] *= 3.0;
            let other = Linear::new(precision, changed, 1000, k, None).unwrap();
            assert_ne!(held(&stacked), held(&other), "{}", precision.name());
        }
        let f32 = Linear::stacked(Precision::F32, &src, &parts, k, None).unwrap();
        let Weight::F32(w) = &f32.weight else {
            panic!("an f32 weight")
        };
        assert_eq!(w, &whole);
    }

    #[test]
    fn a_non_finite_value_in_a_later_block_is_refused_at_its_index_in_the_tensor() {
        let k = 576;
        let (_, (shape, dtype, mut bytes)) = tensor(3, 700, k);
        let at = 600 * k + 7;
        bytes[2 * at..2 * at + 2].copy_from_slice(&0x7FC0u16.to_le_bytes());
        let src = Tensors(HashMap::from([("a".into(), (shape, dtype, bytes))]));
        let err = Linear::stacked(Precision::Int8, &src, &[("a".to_string(), 700)], k, None)
            .err()
            .expect("refused");
        match err {
            Error::Loader(daisy_loader::Error::NonFinite { tensor, index, .. }) => {
                assert_eq!((tensor.as_str(), index), ("a", at));
            }
            other => panic!("expected a non-finite refusal, got {other}"),
        }
        // A part of the wrong shape is refused by name.
        let (_, raw) = tensor(4, 10, k);
        let src = Tensors(HashMap::from([("a".into(), raw)]));
        let err = Linear::stacked(Precision::Int8, &src, &[("a".to_string(), 11)], k, None)
            .err()
            .expect("refused");
        assert!(
            matches!(err, Error::Shape { ref name, .. } if name == "a"),
            "{err}"
        );
    }
}
