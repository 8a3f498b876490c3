//! Where a stage's tensors come from: the checkpoint, or an in-memory table in tests.

use daisy_loader::{DType, MappedBytes};

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
    /// The tensor `name` memory-mapped as stored, with its dtype and shape, where it lies in a
    /// local file as the table it is (`None`: read it instead). Used for the embedding, whose rows
    /// are looked up one token at a time.
    fn map_raw(&self, _name: &str) -> Result<Option<(Vec<usize>, DType, MappedBytes)>> {
        Ok(None)
    }
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

/// Values widened to f32 per block of rows handed out by [`read_rows`] (about 1 MiB).
const ROWS_BLOCK_VALUES: usize = 1 << 18;

/// Read `name` (`rows × cols`, checked as [`read_shaped`] does) and hand it to `each` in blocks of
/// whole rows widened to f32, in order, each block's values checked finite (a refusal names the
/// tensor and the value's index in it, as a whole read does). Only the stored bytes are held whole,
/// never the tensor widened (a Qwen2.5-0.5B down projection is 17 MB in f32, 9 MB as stored). A
/// source without the stored bytes gives one block of the whole tensor.
pub(crate) fn read_rows(
    src: &dyn Source,
    name: &str,
    rows: usize,
    cols: usize,
    each: &mut dyn FnMut(&[f32]) -> Result<()>,
) -> Result<()> {
    let expected = [rows, cols];
    let Some((shape, dtype, bytes)) = src.read_raw(name)? else {
        return each(&read_shaped(src, name, &expected)?);
    };
    if shape != expected || bytes.len() != rows * cols * dtype.size() {
        return Err(Error::Shape {
            name: name.to_string(),
            got: shape,
            expected: expected.to_vec(),
        });
    }
    if cols == 0 {
        return each(&[]);
    }
    let per = (ROWS_BLOCK_VALUES / cols).max(1) * cols * dtype.size();
    for (b, block) in bytes.chunks(per).enumerate() {
        let values = daisy_loader::widen(dtype, block);
        daisy_loader::check_finite(name, &values).map_err(|e| match e {
            daisy_loader::Error::NonFinite {
                tensor,
                index,
                value,
            } => daisy_loader::Error::NonFinite {
                tensor,
                index: b * per / dtype.size() + index,
                value,
            },
            other => other,
        })?;
        each(&values)?;
    }
    Ok(())
}

/// An embedding table in its source dtype; rows are widened exactly on lookup. Where the checkpoint
/// is a local file the table is mapped, not read: only the rows of tokens looked up are resident.
pub(crate) struct Embedding {
    rows: usize,
    cols: usize,
    dtype: DType,
    bytes: Table,
}

enum Table {
    Held(Vec<u8>),
    Mapped(MappedBytes),
}

impl Table {
    fn bytes(&self) -> &[u8] {
        match self {
            Self::Held(b) => b,
            Self::Mapped(m) => m.bytes(),
        }
    }
}

impl Embedding {
    pub(crate) fn load(src: &dyn Source, name: &str, rows: usize, cols: usize) -> Result<Self> {
        let expected = [rows, cols];
        let check = |shape: &[usize], dtype: DType, len: usize| {
            if shape != expected || len != rows * cols * dtype.size() {
                return Err(Error::Shape {
                    name: name.to_string(),
                    got: shape.to_vec(),
                    expected: expected.to_vec(),
                });
            }
            Ok(())
        };
        if let Some((shape, dtype, map)) = src.map_raw(name)? {
            check(&shape, dtype, map.bytes().len())?;
            return Ok(Self {
                rows,
                cols,
                dtype,
                bytes: Table::Mapped(map),
            });
        }
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
                bytes: Table::Held(bytes),
            });
        }
        let data = read_shaped(src, name, &expected)?;
        let bytes = data.iter().flat_map(|v| v.to_le_bytes()).collect();
        Ok(Self {
            rows,
            cols,
            dtype: DType::F32,
            bytes: Table::Held(bytes),
        })
    }

    pub(crate) fn rows(&self) -> usize {
        self.rows
    }

    /// Append row `r` widened to f32 (from the mapping or the held bytes: for whole runs of rows).
    pub(crate) fn row_into(&self, r: usize, out: &mut Vec<f32>) {
        let width = self.cols * self.dtype.size();
        daisy_loader::widen_into(
            self.dtype,
            &self.bytes.bytes()[r * width..(r + 1) * width],
            out,
        );
    }

    /// Append the rows of `ids` (each below [`Self::rows`]) widened to f32. A mapped table's rows
    /// are read from the file (positioned reads, from the page cache), not through the mapping:
    /// none becomes resident, so none has to be given back — faulting a row in mapped the 64 KiB
    /// around it, and giving them back after each token cost about 50 µs of a decode step here
    /// (the kernel flushes the other CPU's address translations).
    pub(crate) fn look_up(&self, ids: &[u32], out: &mut Vec<f32>) -> Result<()> {
        let width = self.cols * self.dtype.size();
        match &self.bytes {
            Table::Held(bytes) => {
                for &id in ids {
                    let r = id as usize;
                    daisy_loader::widen_into(self.dtype, &bytes[r * width..(r + 1) * width], out);
                }
            }
            Table::Mapped(m) => {
                let mut row = vec![0u8; width];
                for &id in ids {
                    m.read_at(id as usize * width, &mut row)?;
                    daisy_loader::widen_into(self.dtype, &row, out);
                }
            }
        }
        Ok(())
    }

    /// The whole table widened to f32 (for a tied lm_head).
    pub(crate) fn to_f32(&self) -> Vec<f32> {
        let mut out = Vec::with_capacity(self.rows * self.cols);
        for r in 0..self.rows {
            self.row_into(r, &mut out);
        }
        out
    }

    /// Rows `r0..r1` are not needed again soon: a mapped table gives their pages back (they are read
    /// from the file again if looked up later); a held one keeps them.
    pub(crate) fn release(&self, r0: usize, r1: usize) {
        if let Table::Mapped(m) = &self.bytes {
            let row = self.cols * self.dtype.size();
            m.release(r0 * row..r1 * row);
        }
    }

    /// Whether the table is mapped from the checkpoint's file rather than held.
    pub(crate) fn is_mapped(&self) -> bool {
        matches!(self.bytes, Table::Mapped(_))
    }

    /// Bytes of the table (held, or mapped and resident only where touched).
    pub(crate) fn bytes(&self) -> usize {
        self.bytes.bytes().len()
    }
}
