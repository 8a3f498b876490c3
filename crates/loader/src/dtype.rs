//! Safetensors element types and their exact widening to f32.

use crate::Error;

/// The element types weights may be stored in (safetensors names). GGUF storage types are
/// [`crate::GgmlType`]; GGUF tensors are read back as one of these.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DType {
    F32,
    F16,
    BF16,
}

impl DType {
    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            DType::F32 => 4,
            DType::F16 | DType::BF16 => 2,
        }
    }

    /// The safetensors spelling (`F32`, `F16`, `BF16`).
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "F32",
            DType::F16 => "F16",
            DType::BF16 => "BF16",
        }
    }

    pub(crate) fn from_safetensors(name: &str) -> Option<DType> {
        match name {
            "F32" => Some(DType::F32),
            "F16" => Some(DType::F16),
            "BF16" => Some(DType::BF16),
            _ => None,
        }
    }
}

impl std::fmt::Display for DType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The dtype names the safetensors format defines (known, even where this loader refuses them).
pub(crate) const KNOWN_SAFETENSORS_DTYPES: &[(&str, usize)] = &[
    ("BOOL", 1),
    ("U8", 1),
    ("I8", 1),
    ("F8_E5M2", 1),
    ("F8_E4M3", 1),
    ("F8_E8M0", 1),
    ("F4", 1),
    ("F6_E2M3", 1),
    ("F6_E3M2", 1),
    ("I16", 2),
    ("U16", 2),
    ("F16", 2),
    ("BF16", 2),
    ("I32", 4),
    ("U32", 4),
    ("F32", 4),
    ("C64", 8),
    ("F64", 8),
    ("I64", 8),
    ("U64", 8),
];

/// BF16 → f32, exact: a bfloat16 is the upper half of an f32.
pub fn widen_bf16(bits: u16) -> f32 {
    f32::from_bits(u32::from(bits) << 16)
}

/// IEEE binary16 → f32, exact for every pattern: signed zeros, subnormals, infinities; NaNs stay
/// NaN with their payload shifted into place.
pub fn widen_f16(bits: u16) -> f32 {
    let sign = u32::from(bits >> 15) << 31;
    let exp = u32::from((bits >> 10) & 0x1f);
    let man = u32::from(bits & 0x3ff);
    let magnitude = match exp {
        0 => {
            // Zero or subnormal: man · 2^-24. `man` < 2^10 and the product is a normal f32, so the
            // multiplication by a power of two is exact.
            let value = man as f32 * f32::from_bits((127 - 24) << 23);
            value.to_bits()
        }
        0x1f => 0x7f80_0000 | (man << 13),
        _ => ((exp + 127 - 15) << 23) | (man << 13),
    };
    f32::from_bits(sign | magnitude)
}

/// f32 → BF16 rounding to nearest, ties to even (NaN stays a quiet NaN).
pub fn bf16_from_f32(value: f32) -> u16 {
    let bits = value.to_bits();
    if value.is_nan() {
        return ((bits >> 16) as u16) | 0x0040;
    }
    let round = 0x7fff + ((bits >> 16) & 1);
    (bits.wrapping_add(round) >> 16) as u16
}

/// Widen little-endian `bytes` of `dtype` to f32, exactly.
pub fn widen(dtype: DType, bytes: &[u8]) -> Vec<f32> {
    let mut out = Vec::with_capacity(bytes.len() / dtype.size());
    widen_into(dtype, bytes, &mut out);
    out
}

/// [`widen`], appended to `out` (a table's rows one after another, with no vector of their own).
pub fn widen_into(dtype: DType, bytes: &[u8], out: &mut Vec<f32>) {
    match dtype {
        DType::F32 => out.extend(
            bytes
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])),
        ),
        DType::F16 => out.extend(
            bytes
                .chunks_exact(2)
                .map(|c| widen_f16(u16::from_le_bytes([c[0], c[1]]))),
        ),
        DType::BF16 => out.extend(
            bytes
                .chunks_exact(2)
                .map(|c| widen_bf16(u16::from_le_bytes([c[0], c[1]]))),
        ),
    }
}

/// Whether every element of `bytes` (little-endian `dtype` values) is finite, judged on the bits:
/// an all-ones exponent is ±inf or NaN in each of the three formats. A trailing partial element is
/// ignored.
pub fn all_finite(dtype: DType, bytes: &[u8]) -> bool {
    match dtype {
        DType::F32 => bytes
            .chunks_exact(4)
            .all(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]) & 0x7F80_0000 != 0x7F80_0000),
        DType::F16 => bytes
            .chunks_exact(2)
            .all(|b| u16::from_le_bytes([b[0], b[1]]) & 0x7C00 != 0x7C00),
        DType::BF16 => bytes
            .chunks_exact(2)
            .all(|b| u16::from_le_bytes([b[0], b[1]]) & 0x7F80 != 0x7F80),
    }
}

/// Refuse the first non-finite value of `values`, naming `tensor`.
pub fn check_finite(tensor: &str, values: &[f32]) -> Result<(), Error> {
    match values.iter().position(|v| !v.is_finite()) {
        None => Ok(()),
        Some(index) => Err(Error::NonFinite {
            tensor: tensor.to_string(),
            index,
            value: values[index],
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The bit test agrees with widening and asking `is_finite`, on every BF16 and F16 pattern and
    /// on F32 patterns around each class boundary.
    #[test]
    fn all_finite_agrees_with_widening_on_every_half_pattern() {
        for dtype in [DType::BF16, DType::F16] {
            for bits in 0..=u16::MAX {
                let bytes = bits.to_le_bytes();
                let want = widen(dtype, &bytes)[0].is_finite();
                assert_eq!(all_finite(dtype, &bytes), want, "{dtype:?} {bits:#06x}");
            }
        }
        for bits in [
            0u32,
            1,
            0x7F7F_FFFF,
            0x7F80_0000,
            0x7FC0_0000,
            0xFF80_0000,
            0x8000_0001,
        ] {
            let bytes = bits.to_le_bytes();
            let want = f32::from_bits(bits).is_finite();
            assert_eq!(all_finite(DType::F32, &bytes), want, "F32 {bits:#010x}");
        }
        let mut run = vec![0u8; 4 * 1000];
        assert!(all_finite(DType::F32, &run));
        run[4 * 999 + 3] = 0x7F;
        run[4 * 999 + 2] = 0x80;
        assert!(!all_finite(DType::F32, &run), "the last element is +inf");
    }
}
