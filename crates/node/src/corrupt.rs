//! Tests only (`--features test-corrupt-kernel`): a backend whose integer GEMM is wrong by one in
//! the last accumulator, so its probe disagrees with every correct device. A member started with
//! `DAISY_TEST_CORRUPT_KERNEL=1` uses it; builds without the feature have no such switch.

use std::sync::Arc;

use daisy_gemm_int8::{Backend, Error, Quantized, Rhs};

struct Corrupt(Arc<dyn Backend>);

impl Backend for Corrupt {
    fn name(&self) -> String {
        format!("{} (corrupted for a test)", self.0.name())
    }

    fn gemm_i32(&self, a: &Quantized, b: Rhs<'_>, out: &mut [i32]) -> Result<(), Error> {
        self.0.gemm_i32(a, b, out)?;
        if let Some(last) = out.last_mut() {
            *last = last.wrapping_add(1);
        }
        Ok(())
    }
}

/// `backend`, corrupted when `DAISY_TEST_CORRUPT_KERNEL` is set.
pub(crate) fn maybe(backend: Arc<dyn Backend>) -> Arc<dyn Backend> {
    if std::env::var_os("DAISY_TEST_CORRUPT_KERNEL").is_some() {
        eprintln!("join: DAISY_TEST_CORRUPT_KERNEL is set: this member's GEMM is wrong on purpose");
        Arc::new(Corrupt(backend))
    } else {
        backend
    }
}
