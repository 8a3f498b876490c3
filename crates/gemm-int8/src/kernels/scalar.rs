//! The portable kernel: plain i32 multiply-adds over the panel layout.

use crate::packed::{PANEL, PackedWeights};

/// See [`super::gemm_panels`]; `a` holds i8 bytes.
///
/// # Safety
/// As [`super::gemm_panels`].
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn gemm_panels(
    a: &[u8],
    t: usize,
    k: usize,
    b: &PackedWeights,
    p0: usize,
    p1: usize,
    out: *mut i32,
    n: usize,
) {
    let (lines, groups) = (b.lines(), b.groups());
    for p in p0..p1 {
        let (first, stride) = b.line_place(p);
        for c in 0..PANEL.min(n - p * PANEL) {
            let col = p * PANEL + c;
            for r in 0..t {
                let row = &a[r * k..r * k + 4 * groups];
                let mut acc = 0i32;
                let panel = lines
                    .get(first..)
                    .unwrap_or_default()
                    .iter()
                    .step_by(stride);
                for (line, quad) in panel.zip(row.chunks_exact(4)) {
                    for (&x, &y) in quad.iter().zip(&line.0[4 * c..4 * c + 4]) {
                        acc += i32::from(x as i8) * i32::from(y);
                    }
                }
                // SAFETY: r < t, col < n, inside the caller's columns.
                unsafe { *out.add(r * n + col) = acc };
            }
        }
    }
}
