//! Where a stage's tensors come from: the checkpoint, or an in-memory table in tests.

use daisy_loader::DType;

use crate::{Error, Result};

/// A tensor as stored: shape, dtype and little-endian bytes.
pub type RawTensor = (Vec<usize>, DType, Vec<u8>);

/// The tensors a stage reads. A stage asks only for the tensors it owns.
pub trait Source {
    /// The tensor `name` widened exactly to f32, with its shape.
    fn read_f32(&self, name: &str) -> Result<(Vec<usize>, Vec<f32>)>;
    /// The tensor `name` in its stored dtype when that is f32, f16 or bf16 (`None` otherwise), with
    /// its shape. Used for the embedding, which is kept in its source dtype.
    fn read_raw(&self, name: &str) -> Result<Option<RawTensor>>;
    /// Whether the checkpoint has a tensor `name`.
    fn has(&self, name: &str) -> bool;
    /// The model fingerprint (DESIGN.md §4).
    fn fingerprint(&self) -> [u8; 32];
}

/// Read `name` and check its shape.
pub(crate) fn read_shaped(src: &dyn Source, name: &str, expected: &[usize]) -> Result<Vec<f32>> {
    let (shape, data) = src.read_f32(name)?;
    if shape != expected || data.len() != expected.iter().product::<usize>() {
        return Err(Error::Shape {
            name: name.to_string(),
            got: shape,
            expected: expected.to_vec(),
        });
    }
    Ok(data)
}

/// An embedding table held in its source dtype; rows are widened exactly on lookup.
pub(crate) struct Embedding {
    rows: usize,
    cols: usize,
    dtype: DType,
    bytes: Vec<u8>,
}

impl Embedding {
    pub(crate) fn load(src: &dyn Source, name: &str, rows: usize, cols: usize) -> Result<Self> {
        let expected = [rows, cols];
        if let Some((shape, dtype, bytes)) = src.read_raw(name)? {
            let width = dtype.size();
            if shape != expected || bytes.len() != rows * cols * width {
                return Err(Error::Shape {
                    name: name.to_string(),
                    got: shape,
                    expected: expected.to_vec(),
                });
            }
            return Ok(Self {
                rows,
                cols,
                dtype,
                bytes,
            });
        }
        let data = read_shaped(src, name, &expected)?;
        let bytes = data.iter().flat_map(|v| v.to_le_bytes()).collect();
        Ok(Self {
            rows,
            cols,
            dtype: DType::F32,
            bytes,
        })
    }

    pub(crate) fn rows(&self) -> usize {
        self.rows
    }

    /// Append row `r` widened to f32.
    pub(crate) fn row_into(&self, r: usize, out: &mut Vec<f32>) {
        match self.dtype {
            DType::F32 => {
                let b = &self.bytes[r * self.cols * 4..(r + 1) * self.cols * 4];
                out.extend(
                    b.chunks_exact(4)
                        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])),
                );
            }
            DType::BF16 => {
                let b = &self.bytes[r * self.cols * 2..(r + 1) * self.cols * 2];
                out.extend(
                    b.chunks_exact(2)
                        .map(|c| f32::from_bits((u16::from_le_bytes([c[0], c[1]]) as u32) << 16)),
                );
            }
            DType::F16 => {
                let b = &self.bytes[r * self.cols * 2..(r + 1) * self.cols * 2];
                out.extend(
                    b.chunks_exact(2)
                        .map(|c| half::f16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f32()),
                );
            }
        }
    }

    /// The whole table widened to f32 (for a tied lm_head).
    pub(crate) fn to_f32(&self) -> Vec<f32> {
        let mut out = Vec::with_capacity(self.rows * self.cols);
        for r in 0..self.rows {
            self.row_into(r, &mut out);
        }
        out
    }

    /// Bytes held.
    pub(crate) fn bytes(&self) -> usize {
        self.bytes.len()
    }
}
