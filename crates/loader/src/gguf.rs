//! GGUF as a second checkpoint format: header, metadata, tensor infos and alignment, and
//! dequantization of F32, F16, BF16, Q8_0, Q4_0 and Q4_1 exactly as llama.cpp's reference
//! (`ggml-quants.c`, `dequantize_row_*`) defines it.
//!
//! Layout (GGUF v2/v3): magic `GGUF`, u32 version, u64 tensor count, u64 metadata count, the
//! metadata key/value pairs, the tensor infos (name, dims with the fastest-varying first, type,
//! offset relative to the data section), then the data section at the next multiple of
//! `general.alignment` (default 32).

use std::collections::BTreeMap;

pub use crate::gguf_tokenizer::{tokenizer_config_json, tokenizer_json};
use crate::{ByteSource, Error, widen_bf16, widen_f16};

/// A metadata value.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    U64(u64),
    I64(i64),
    F32(f32),
    F64(f64),
    Bool(bool),
    String(String),
    Array(Vec<Value>),
}

impl Value {
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::String(s) => Some(s),
            _ => None,
        }
    }

    /// Any non-negative integer value.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            Value::U8(v) => Some(v.into()),
            Value::U16(v) => Some(v.into()),
            Value::U32(v) => Some(v.into()),
            Value::U64(v) => Some(v),
            Value::I8(v) => u64::try_from(v).ok(),
            Value::I16(v) => u64::try_from(v).ok(),
            Value::I32(v) => u64::try_from(v).ok(),
            Value::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    pub fn as_i64(&self) -> Option<i64> {
        match *self {
            Value::I8(v) => Some(v.into()),
            Value::I16(v) => Some(v.into()),
            Value::I32(v) => Some(v.into()),
            Value::I64(v) => Some(v),
            _ => self.as_u64().and_then(|v| i64::try_from(v).ok()),
        }
    }

    pub fn as_f32(&self) -> Option<f32> {
        match *self {
            Value::F32(v) => Some(v),
            Value::F64(v) => Some(v as f32),
            _ => None,
        }
    }

    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            Value::Bool(v) => Some(v),
            _ => None,
        }
    }

    pub fn as_array(&self) -> Option<&[Value]> {
        match self {
            Value::Array(v) => Some(v),
            _ => None,
        }
    }
}

/// GGML tensor storage types. Only some are supported; the rest are named in refusals.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GgmlType {
    F32,
    F16,
    Q4_0,
    Q4_1,
    Q8_0,
    BF16,
    /// Any other type id, kept so a refusal can name it.
    Other(u32),
}

impl GgmlType {
    fn from_id(id: u32) -> GgmlType {
        match id {
            0 => GgmlType::F32,
            1 => GgmlType::F16,
            2 => GgmlType::Q4_0,
            3 => GgmlType::Q4_1,
            8 => GgmlType::Q8_0,
            30 => GgmlType::BF16,
            other => GgmlType::Other(other),
        }
    }

    /// llama.cpp's name for the type.
    pub fn name(self) -> String {
        const OTHER: &[(u32, &str)] = &[
            (6, "Q5_0"),
            (7, "Q5_1"),
            (9, "Q8_1"),
            (10, "Q2_K"),
            (11, "Q3_K"),
            (12, "Q4_K"),
            (13, "Q5_K"),
            (14, "Q6_K"),
            (15, "Q8_K"),
            (16, "IQ2_XXS"),
            (17, "IQ2_XS"),
            (18, "IQ3_XXS"),
            (19, "IQ1_S"),
            (20, "IQ4_NL"),
            (21, "IQ3_S"),
            (22, "IQ2_S"),
            (23, "IQ4_XS"),
            (24, "I8"),
            (25, "I16"),
            (26, "I32"),
            (27, "I64"),
            (28, "F64"),
            (29, "IQ1_M"),
            (34, "TQ1_0"),
            (35, "TQ2_0"),
            (39, "MXFP4"),
        ];
        match self {
            GgmlType::F32 => "F32".into(),
            GgmlType::F16 => "F16".into(),
            GgmlType::Q4_0 => "Q4_0".into(),
            GgmlType::Q4_1 => "Q4_1".into(),
            GgmlType::Q8_0 => "Q8_0".into(),
            GgmlType::BF16 => "BF16".into(),
            GgmlType::Other(id) => match OTHER.iter().find(|(i, _)| *i == id) {
                Some((_, name)) => format!("{name} (type {id})"),
                None => format!("unknown type {id}"),
            },
        }
    }

    /// (elements per block, bytes per block), for supported types.
    pub fn block(self) -> Option<(usize, usize)> {
        match self {
            GgmlType::F32 => Some((1, 4)),
            GgmlType::F16 | GgmlType::BF16 => Some((1, 2)),
            GgmlType::Q4_0 => Some((32, 18)),
            GgmlType::Q4_1 => Some((32, 20)),
            GgmlType::Q8_0 => Some((32, 34)),
            GgmlType::Other(_) => None,
        }
    }
}

impl std::fmt::Display for GgmlType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.name())
    }
}

/// One tensor info of a GGUF file.
#[derive(Clone, Debug)]
pub struct GgufTensor {
    pub name: String,
    /// Dimensions as stored: the fastest-varying first (the reverse of a row-major shape).
    pub dims: Vec<u64>,
    pub ggml_type: GgmlType,
    /// Absolute offset in the file.
    pub offset: u64,
    /// Stored byte length (0 for unsupported types, whose size is unknown here).
    pub byte_len: u64,
}

impl GgufTensor {
    /// Row-major shape (`[rows, cols]` for a matrix).
    pub fn shape(&self) -> Vec<usize> {
        self.dims.iter().rev().map(|&d| d as usize).collect()
    }

    pub fn elements(&self) -> u64 {
        self.dims.iter().product()
    }
}

/// A parsed GGUF header.
#[derive(Clone, Debug)]
pub struct GgufFile {
    pub version: u32,
    pub metadata: BTreeMap<String, Value>,
    pub tensors: Vec<GgufTensor>,
    pub alignment: u64,
    /// Absolute offset of the data section.
    pub data_start: u64,
    /// Bytes from the start of the file to the end of the tensor infos (what the fingerprint hashes).
    pub header_len: u64,
}

/// A forward reader over a [`ByteSource`] that fetches in chunks.
struct Cursor<'a> {
    src: &'a dyn ByteSource,
    size: u64,
    pos: u64,
    buf: Vec<u8>,
    buf_start: u64,
    file: String,
}

const CHUNK: usize = 1 << 20;

impl Cursor<'_> {
    fn err(&self, problem: String) -> Error {
        Error::Gguf {
            file: self.file.clone(),
            problem,
        }
    }

    fn take(&mut self, n: usize) -> Result<&[u8], Error> {
        let end = self
            .pos
            .checked_add(n as u64)
            .filter(|&e| e <= self.size)
            .ok_or_else(|| {
                self.err(format!(
                    "truncated: {n} bytes needed at offset {} but the file has {}",
                    self.pos, self.size
                ))
            })?;
        let buf_end = self.buf_start + self.buf.len() as u64;
        if self.pos < self.buf_start || end > buf_end {
            let want = (n.max(CHUNK) as u64).min(self.size - self.pos) as usize;
            self.buf = self.src.read_at(self.pos, want)?;
            self.buf_start = self.pos;
        }
        let start = (self.pos - self.buf_start) as usize;
        self.pos = end;
        Ok(&self.buf[start..start + n])
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], Error> {
        Ok(self.take(N)?.try_into().expect("N bytes"))
    }

    fn u32(&mut self) -> Result<u32, Error> {
        Ok(u32::from_le_bytes(self.array()?))
    }

    fn u64(&mut self) -> Result<u64, Error> {
        Ok(u64::from_le_bytes(self.array()?))
    }

    fn remaining(&self) -> u64 {
        self.size - self.pos
    }

    fn string(&mut self) -> Result<String, Error> {
        let n = self.u64()?;
        if n > self.remaining() {
            return Err(self.err(format!(
                "string of {n} bytes at offset {} runs past the end of the file",
                self.pos
            )));
        }
        let bytes = self.take(n as usize)?.to_vec();
        String::from_utf8(bytes).map_err(|e| self.err(format!("string is not UTF-8: {e}")))
    }

    fn value(&mut self, kind: u32, depth: u32) -> Result<Value, Error> {
        Ok(match kind {
            0 => Value::U8(self.array::<1>()?[0]),
            1 => Value::I8(self.array::<1>()?[0] as i8),
            2 => Value::U16(u16::from_le_bytes(self.array()?)),
            3 => Value::I16(i16::from_le_bytes(self.array()?)),
            4 => Value::U32(self.u32()?),
            5 => Value::I32(i32::from_le_bytes(self.array()?)),
            6 => Value::F32(f32::from_le_bytes(self.array()?)),
            7 => match self.array::<1>()?[0] {
                0 => Value::Bool(false),
                1 => Value::Bool(true),
                b => return Err(self.err(format!("bool value {b}, expected 0 or 1"))),
            },
            8 => Value::String(self.string()?),
            9 => {
                if depth > 0 {
                    return Err(self.err("nested arrays are not supported".into()));
                }
                let inner = self.u32()?;
                let count = self.u64()?;
                // Every element takes at least one byte: a count beyond the file is a lie.
                if count > self.remaining() {
                    return Err(self.err(format!(
                        "array of {count} elements runs past the end of the file"
                    )));
                }
                let mut items = Vec::with_capacity(count as usize);
                for _ in 0..count {
                    items.push(self.value(inner, depth + 1)?);
                }
                Value::Array(items)
            }
            10 => Value::U64(self.u64()?),
            11 => Value::I64(i64::from_le_bytes(self.array()?)),
            12 => Value::F64(f64::from_le_bytes(self.array()?)),
            other => return Err(self.err(format!("unknown metadata value type {other}"))),
        })
    }
}

/// Parse the header, metadata and tensor infos of the GGUF file in `src`, and check every tensor's
/// byte range against the file.
pub fn read_gguf(src: &dyn ByteSource) -> Result<GgufFile, Error> {
    let size = src.len()?;
    let mut c = Cursor {
        src,
        size,
        pos: 0,
        buf: Vec::new(),
        buf_start: 0,
        file: src.describe(),
    };
    let magic = c.array::<4>()?;
    if &magic != b"GGUF" {
        return Err(c.err(format!("magic {magic:?} is not \"GGUF\"")));
    }
    let version = c.u32()?;
    if !(2..=3).contains(&version) {
        return Err(c.err(format!(
            "version {version} is not supported (expected 2 or 3)"
        )));
    }
    let n_tensors = c.u64()?;
    let n_kv = c.u64()?;
    if n_tensors > size || n_kv > size {
        return Err(c.err(format!(
            "{n_tensors} tensors and {n_kv} metadata entries cannot fit"
        )));
    }
    let mut metadata = BTreeMap::new();
    for _ in 0..n_kv {
        let key = c.string()?;
        let kind = c.u32()?;
        let value = c.value(kind, 0)?;
        if metadata.insert(key.clone(), value).is_some() {
            return Err(c.err(format!("metadata key `{key}` appears twice")));
        }
    }
    let alignment = match metadata.get("general.alignment") {
        None => 32,
        Some(v) => match v.as_u64() {
            Some(a) if a > 0 && a.is_power_of_two() => a,
            _ => return Err(c.err(format!("general.alignment {v:?} is not a power of two"))),
        },
    };
    let mut infos = Vec::with_capacity(n_tensors as usize);
    for _ in 0..n_tensors {
        let name = c.string()?;
        let n_dims = c.u32()?;
        if n_dims == 0 || n_dims > 4 {
            return Err(c.err(format!(
                "tensor `{name}` has {n_dims} dimensions (expected 1 to 4)"
            )));
        }
        let mut dims = Vec::new();
        for _ in 0..n_dims {
            dims.push(c.u64()?);
        }
        let ggml_type = GgmlType::from_id(c.u32()?);
        let rel = c.u64()?;
        infos.push((name, dims, ggml_type, rel));
    }
    let header_len = c.pos;
    let data_start = header_len.div_ceil(alignment) * alignment;
    let mut tensors = Vec::with_capacity(infos.len());
    let mut problems = Vec::new();
    for (name, dims, ggml_type, rel) in infos {
        let elements = dims.iter().try_fold(1u64, |a, &d| a.checked_mul(d));
        let byte_len = match (ggml_type.block(), elements) {
            (_, None) => {
                problems.push(format!("tensor `{name}` dims {dims:?} overflow"));
                continue;
            }
            (None, _) => 0,
            (Some((per_block, block_bytes)), Some(n)) => {
                if !dims[0].is_multiple_of(per_block as u64) {
                    problems.push(format!(
                        "tensor `{name}` row length {} is not a multiple of the {} block of {per_block}",
                        dims[0], ggml_type
                    ));
                    continue;
                }
                n / per_block as u64 * block_bytes as u64
            }
        };
        if !rel.is_multiple_of(alignment) {
            problems.push(format!(
                "tensor `{name}` offset {rel} is not aligned to {alignment}"
            ));
        }
        let offset = data_start.checked_add(rel);
        match offset.and_then(|o| o.checked_add(byte_len)) {
            Some(end) if end <= size => {}
            _ => problems.push(format!(
                "tensor `{name}` ({byte_len} bytes at data offset {rel}) runs past the end of the file ({size} bytes)"
            )),
        }
        tensors.push(GgufTensor {
            name,
            dims,
            ggml_type,
            offset: offset.unwrap_or(u64::MAX),
            byte_len,
        });
    }
    if !problems.is_empty() {
        return Err(c.err(problems.join("; ")));
    }
    let mut spans: Vec<(u64, u64, &str)> = tensors
        .iter()
        .filter(|t| t.byte_len > 0)
        .map(|t| (t.offset, t.offset + t.byte_len, t.name.as_str()))
        .collect();
    spans.sort();
    for pair in spans.windows(2) {
        if pair[1].0 < pair[0].1 {
            return Err(c.err(format!(
                "tensor `{}` overlaps tensor `{}`",
                pair[1].2, pair[0].2
            )));
        }
    }
    Ok(GgufFile {
        version,
        metadata,
        tensors,
        alignment,
        data_start,
        header_len,
    })
}

/// Dequantize `bytes` of type `ty` to f32, as llama.cpp's `dequantize_row_*` reference does.
/// `tensor` names the tensor in refusals.
pub fn dequantize(tensor: &str, ty: GgmlType, bytes: &[u8]) -> Result<Vec<f32>, Error> {
    let Some((per_block, block_bytes)) = ty.block() else {
        return Err(Error::UnsupportedGgmlType {
            file: String::new(),
            tensor: tensor.to_string(),
            ggml_type: ty.name(),
        });
    };
    if !bytes.len().is_multiple_of(block_bytes) {
        return Err(Error::Gguf {
            file: String::new(),
            problem: format!(
                "tensor `{tensor}` has {} bytes, not a whole number of {ty} blocks of {block_bytes}",
                bytes.len()
            ),
        });
    }
    let mut out = Vec::with_capacity(bytes.len() / block_bytes * per_block);
    let f16 = |b: &[u8], i: usize| widen_f16(u16::from_le_bytes([b[i], b[i + 1]]));
    match ty {
        GgmlType::F32 => out.extend(
            bytes
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])),
        ),
        GgmlType::F16 => out.extend(bytes.chunks_exact(2).map(|c| f16(c, 0))),
        GgmlType::BF16 => out.extend(
            bytes
                .chunks_exact(2)
                .map(|c| widen_bf16(u16::from_le_bytes([c[0], c[1]]))),
        ),
        GgmlType::Q8_0 => {
            // block_q8_0 { ggml_half d; int8_t qs[32]; }: y = qs[j] * d
            for b in bytes.chunks_exact(34) {
                let d = f16(b, 0);
                out.extend(b[2..34].iter().map(|&q| f32::from(q as i8) * d));
            }
        }
        GgmlType::Q4_0 => {
            // block_q4_0 { ggml_half d; uint8_t qs[16]; }: low nibbles are elements 0..16, high
            // nibbles 16..32, each (nibble - 8) * d
            for b in bytes.chunks_exact(18) {
                let d = f16(b, 0);
                let qs = &b[2..18];
                out.extend(qs.iter().map(|&q| f32::from((q & 0x0f) as i8 - 8) * d));
                out.extend(qs.iter().map(|&q| f32::from((q >> 4) as i8 - 8) * d));
            }
        }
        GgmlType::Q4_1 => {
            // block_q4_1 { ggml_half d; ggml_half m; uint8_t qs[16]; }: nibble * d + m, two
            // roundings (a product, then a sum; Rust never contracts this into an FMA)
            for b in bytes.chunks_exact(20) {
                let d = f16(b, 0);
                let m = f16(b, 2);
                let qs = &b[4..20];
                out.extend(qs.iter().map(|&q| f32::from(q & 0x0f) * d + m));
                out.extend(qs.iter().map(|&q| f32::from(q >> 4) * d + m));
            }
        }
        GgmlType::Other(_) => unreachable!("refused above"),
    }
    Ok(out)
}

/// Undo llama.cpp's RoPE row permutation of a Q or K projection (weight or bias) converted from
/// Hugging Face with `general.architecture = llama`. `convert_hf_to_gguf.py` reshapes the rows as
/// `[heads, 2, head_dim/2]` and swaps the last two axes; stored row `h·d + 2j + t` is Hugging Face
/// row `h·d + t·d/2 + j`. `row_len` is the number of values per row (1 for a bias).
pub fn unpermute_rows<T: Copy>(values: &[T], heads: usize, row_len: usize) -> Vec<T> {
    let rows = values.len() / row_len;
    let d = rows / heads;
    let half = d / 2;
    let mut out = values.to_vec();
    for h in 0..heads {
        for j in 0..half {
            for t in 0..2 {
                let stored = h * d + 2 * j + t;
                let hf = h * d + t * half + j;
                out[hf * row_len..(hf + 1) * row_len]
                    .copy_from_slice(&values[stored * row_len..(stored + 1) * row_len]);
            }
        }
    }
    out
}
