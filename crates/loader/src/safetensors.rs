//! The safetensors container: an 8-byte little-endian header length, a JSON header naming each
//! tensor's dtype, shape and byte range, then the data. Headers are validated into a typed index
//! without reading the data; a writer for the same format is here too (fixtures and tests).

use std::collections::BTreeMap;

use serde_json::Value;

use crate::dtype::KNOWN_SAFETENSORS_DTYPES;
use crate::{ByteSource, DType, Error};

/// Headers larger than this are refused before they are read.
pub const MAX_HEADER_BYTES: u64 = 100_000_000;

/// One tensor of a safetensors file, validated.
#[derive(Clone, Debug)]
pub struct StTensor {
    pub name: String,
    pub dtype: DType,
    pub shape: Vec<usize>,
    /// Absolute byte offset of the first element in the file.
    pub offset: u64,
    pub byte_len: u64,
}

/// A validated safetensors header.
#[derive(Clone, Debug)]
pub struct StHeader {
    /// The JSON header bytes exactly as stored (what the model fingerprint hashes).
    pub header_bytes: Vec<u8>,
    /// Tensors in data order.
    pub tensors: Vec<StTensor>,
    pub metadata: BTreeMap<String, String>,
}

/// Read and validate the header of the safetensors file in `source`. Every problem of the header
/// is reported (several at once when they are independent).
pub fn read_header(source: &dyn ByteSource) -> Result<StHeader, Error> {
    let file = source.describe();
    let bad = |problem: String| Error::Safetensors {
        file: file.clone(),
        problem,
    };
    let size = source.len()?;
    if size < 8 {
        return Err(bad(format!(
            "file is {size} bytes, shorter than the 8-byte header length"
        )));
    }
    let n = u64::from_le_bytes(source.read_at(0, 8)?.try_into().expect("8 bytes"));
    if n > MAX_HEADER_BYTES {
        return Err(bad(format!(
            "header length {n} exceeds the limit of {MAX_HEADER_BYTES} bytes"
        )));
    }
    if n > size - 8 {
        return Err(bad(format!(
            "header length {n} runs past the end of the file ({} bytes after the length)",
            size - 8
        )));
    }
    let header_bytes = source.read_at(8, n as usize)?;
    let data_start = 8 + n;
    let data_len = size - data_start;
    let (tensors, metadata) = parse_header(&header_bytes, data_start, data_len).map_err(bad)?;
    let mut unsupported = Vec::new();
    let mut ok = Vec::new();
    for (name, dtype_name, shape, offset, byte_len) in tensors {
        match DType::from_safetensors(&dtype_name) {
            Some(dtype) => ok.push(StTensor {
                name,
                dtype,
                shape,
                offset,
                byte_len,
            }),
            None => unsupported.push(Error::UnsupportedDtype {
                file: file.clone(),
                tensor: name,
                dtype: dtype_name,
            }),
        }
    }
    Error::from_list(unsupported)?;
    Ok(StHeader {
        header_bytes,
        tensors: ok,
        metadata,
    })
}

type Parsed = (
    Vec<(String, String, Vec<usize>, u64, u64)>,
    BTreeMap<String, String>,
);

fn parse_header(bytes: &[u8], data_start: u64, data_len: u64) -> Result<Parsed, String> {
    let text = std::str::from_utf8(bytes).map_err(|e| format!("header is not UTF-8: {e}"))?;
    let root: BTreeMap<String, Value> =
        serde_json::from_str(text).map_err(|e| format!("header is not a JSON object: {e}"))?;
    let mut metadata = BTreeMap::new();
    let mut problems = Vec::new();
    let mut tensors = Vec::new();
    for (name, entry) in root {
        if name == "__metadata__" {
            match entry {
                Value::Object(map) => {
                    for (k, v) in map {
                        match v {
                            Value::String(s) => {
                                metadata.insert(k, s);
                            }
                            other => problems.push(format!(
                                "__metadata__ value of `{k}` is {other}, expected a string"
                            )),
                        }
                    }
                }
                other => problems.push(format!("__metadata__ is {other}, expected an object")),
            }
            continue;
        }
        match parse_entry(&name, &entry, data_len) {
            Ok((dtype, shape, start, end)) => {
                tensors.push((name, dtype, shape, data_start + start, end - start))
            }
            Err(p) => problems.push(p),
        }
    }
    // Offsets must not overlap (zero-length tensors occupy nothing).
    let mut spans: Vec<(u64, u64, &str)> = tensors
        .iter()
        .filter(|t| t.4 > 0)
        .map(|t| (t.3, t.3 + t.4, t.0.as_str()))
        .collect();
    spans.sort();
    for pair in spans.windows(2) {
        if pair[1].0 < pair[0].1 {
            problems.push(format!(
                "tensor `{}` (bytes {}..{}) overlaps tensor `{}` (bytes {}..{})",
                pair[1].2,
                pair[1].0 - data_start,
                pair[1].1 - data_start,
                pair[0].2,
                pair[0].0 - data_start,
                pair[0].1 - data_start
            ));
        }
    }
    if !problems.is_empty() {
        return Err(problems.join("; "));
    }
    tensors.sort_by_key(|t| (t.3, t.0.clone()));
    Ok((tensors, metadata))
}

fn parse_entry(
    name: &str,
    entry: &Value,
    data_len: u64,
) -> Result<(String, Vec<usize>, u64, u64), String> {
    let obj = entry
        .as_object()
        .ok_or_else(|| format!("tensor `{name}` entry is not an object"))?;
    for key in obj.keys() {
        if !["dtype", "shape", "data_offsets"].contains(&key.as_str()) {
            return Err(format!("tensor `{name}` has unknown field `{key}`"));
        }
    }
    let dtype = obj
        .get("dtype")
        .and_then(Value::as_str)
        .ok_or_else(|| format!("tensor `{name}` has no string dtype"))?;
    let Some(&(_, elem)) = KNOWN_SAFETENSORS_DTYPES.iter().find(|(d, _)| *d == dtype) else {
        return Err(format!("tensor `{name}` has unknown dtype `{dtype}`"));
    };
    let shape: Vec<usize> = obj
        .get("shape")
        .and_then(Value::as_array)
        .ok_or_else(|| format!("tensor `{name}` has no shape array"))?
        .iter()
        .map(|d| d.as_u64().and_then(|d| usize::try_from(d).ok()))
        .collect::<Option<_>>()
        .ok_or_else(|| format!("tensor `{name}` shape is not a list of non-negative integers"))?;
    let offsets = obj
        .get("data_offsets")
        .and_then(Value::as_array)
        .filter(|a| a.len() == 2)
        .and_then(|a| Some((a[0].as_u64()?, a[1].as_u64()?)))
        .ok_or_else(|| format!("tensor `{name}` data_offsets is not [start, end]"))?;
    let (start, end) = offsets;
    if start > end {
        return Err(format!(
            "tensor `{name}` data_offsets [{start}, {end}] end before they start"
        ));
    }
    if end > data_len {
        return Err(format!(
            "tensor `{name}` data_offsets [{start}, {end}] run past the end of the data ({data_len} bytes)"
        ));
    }
    let expected = shape
        .iter()
        .try_fold(elem as u64, |acc, &d| acc.checked_mul(d as u64))
        .ok_or_else(|| format!("tensor `{name}` shape {shape:?} overflows"))?;
    if expected != end - start {
        return Err(format!(
            "tensor `{name}` shape {shape:?} of {dtype} needs {expected} bytes but data_offsets \
             [{start}, {end}] hold {}",
            end - start
        ));
    }
    Ok((dtype.to_string(), shape, start, end))
}

/// One tensor to write: name, dtype, shape and its little-endian bytes.
pub struct TensorToWrite<'a> {
    pub name: &'a str,
    pub dtype: DType,
    pub shape: &'a [usize],
    pub data: &'a [u8],
}

/// Serialize tensors (in the given order) as a safetensors file with `metadata` in
/// `__metadata__`. The header is padded with spaces to a multiple of 8 bytes, as the reference
/// writer does. Panics only if a tensor's byte length disagrees with its shape (a caller bug).
pub fn serialize(tensors: &[TensorToWrite<'_>], metadata: &BTreeMap<String, String>) -> Vec<u8> {
    let mut header = serde_json::Map::new();
    if !metadata.is_empty() {
        header.insert(
            "__metadata__".into(),
            serde_json::to_value(metadata).expect("strings"),
        );
    }
    let mut offset = 0usize;
    for t in tensors {
        let n: usize = t.shape.iter().product::<usize>() * t.dtype.size();
        assert_eq!(
            n,
            t.data.len(),
            "tensor {} byte length disagrees with its shape",
            t.name
        );
        header.insert(
            t.name.to_string(),
            serde_json::json!({"dtype": t.dtype.name(), "shape": t.shape, "data_offsets": [offset, offset + n]}),
        );
        offset += n;
    }
    let mut text = serde_json::to_string(&Value::Object(header)).expect("json");
    while !text.len().is_multiple_of(8) {
        text.push(' ');
    }
    let mut out = Vec::with_capacity(8 + text.len() + offset);
    out.extend_from_slice(&(text.len() as u64).to_le_bytes());
    out.extend_from_slice(text.as_bytes());
    for t in tensors {
        out.extend_from_slice(t.data);
    }
    out
}
