//! Stages read straight from a `daisy_loader::Checkpoint`: its tensors served through [`Source`].

use daisy_loader::Checkpoint;

use crate::source::{RawTensor, Source};
use crate::{Error, Result};

fn shape(ck: &Checkpoint, name: &str) -> Result<Vec<usize>> {
    ck.tensor(name)
        .map(|t| t.shape.clone())
        .ok_or_else(|| Error::Loader(daisy_loader::Error::NoSuchTensor(name.to_string())))
}

impl Source for Checkpoint {
    fn read_f32(&self, name: &str) -> Result<(Vec<usize>, Vec<f32>)> {
        let shape = shape(self, name)?;
        Ok((shape, Checkpoint::read_f32(self, name)?))
    }

    fn read_raw(&self, name: &str) -> Result<Option<RawTensor>> {
        let shape = shape(self, name)?;
        let (dtype, bytes) = Checkpoint::read_raw(self, name)?;
        // Non-finite embedding rows are refused on lookup (the embedding's output is checked).
        Ok(Some((shape, dtype, bytes)))
    }

    fn map_raw(
        &self,
        name: &str,
    ) -> Result<Option<(Vec<usize>, daisy_loader::DType, daisy_loader::MappedBytes)>> {
        let shape = shape(self, name)?;
        Ok(Checkpoint::map_raw(self, name)?.map(|(dtype, map)| (shape, dtype, map)))
    }

    fn has(&self, name: &str) -> bool {
        self.tensor(name).is_some()
    }

    fn fingerprint(&self) -> [u8; 32] {
        Checkpoint::fingerprint(self)
    }
}
