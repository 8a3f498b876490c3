//! Undoing llama.cpp's RoPE row permutation: `convert_hf_to_gguf.py` writes Q and K of
//! `general.architecture = llama` as `w.reshape(n_head, 2, rows/n_head/2, cols).swapaxes(1, 2)`.
//! The permutation is written here the way numpy evaluates it (a strided view copied out in
//! C order), and ours must invert it — with the right head count only.

use daisy_loader::gguf::unpermute_rows;

/// numpy: `w.reshape(h, 2, half, cols).swapaxes(1, 2).reshape(rows, cols)`.
fn llama_cpp_permute(w: &[f32], heads: usize, cols: usize) -> Vec<f32> {
    let rows = w.len() / cols;
    let half = rows / heads / 2;
    // The swapped view has shape (h, half, 2, cols); element [a, b, c, e] is source [a, c, b, e].
    let mut out = Vec::with_capacity(w.len());
    for a in 0..heads {
        for b in 0..half {
            for c in 0..2 {
                let src_row = (a * 2 + c) * half + b;
                out.extend_from_slice(&w[src_row * cols..(src_row + 1) * cols]);
            }
        }
    }
    out
}

#[test]
fn unpermute_inverts_llama_cpp_for_q_and_k() {
    let cols = 3;
    for (heads, head_dim) in [(9, 64), (3, 64), (2, 4), (1, 6)] {
        let rows = heads * head_dim;
        let hf: Vec<f32> = (0..rows * cols).map(|i| i as f32).collect();
        let stored = llama_cpp_permute(&hf, heads, cols);
        assert_ne!(stored, hf, "{heads}x{head_dim}: the permutation moves rows");
        assert_eq!(
            unpermute_rows(&stored, heads, cols),
            hf,
            "{heads}x{head_dim}"
        );
        // A bias is a matrix of one column.
        let bias: Vec<f32> = (0..rows).map(|i| i as f32).collect();
        assert_eq!(
            unpermute_rows(&llama_cpp_permute(&bias, heads, 1), heads, 1),
            bias
        );
    }
}

#[test]
fn the_wrong_head_count_does_not_invert() {
    // K of SmolLM2 is permuted with n_head_kv = 3; undoing it with n_head = 9 must differ.
    let (kv_heads, heads, head_dim, cols) = (3, 9, 64, 2);
    let hf: Vec<f32> = (0..kv_heads * head_dim * cols).map(|i| i as f32).collect();
    let stored = llama_cpp_permute(&hf, kv_heads, cols);
    assert_ne!(unpermute_rows(&stored, heads, cols), hf);
    assert_eq!(unpermute_rows(&stored, kv_heads, cols), hf);
}
