//! The parameter shard (GUIDE, "Parameter shard"): a stage keeps its int8 layer weights in one flat
//! host buffer and at most two layers on the device at once — the one running and the next,
//! uploaded while the current one runs. A third live layer is refused; a single-layer stage stays
//! resident. The bytes the GEMM reads are the same bytes either way, so streaming changes no bit.

use std::sync::Arc;

use crate::backend::{GpuBackend, GpuWeights};
use crate::error::{Error, Result};

/// The most layers on the device at once.
pub const MAX_LIVE_LAYERS: usize = 2;

/// One weight matrix of a layer: `n` output channels (rows) by `k` inputs, row-major int8.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MatrixShape {
    pub n: usize,
    pub k: usize,
}

/// Where one matrix lies in the flat buffer.
#[derive(Debug, Clone, Copy)]
struct Span {
    start: usize,
    shape: MatrixShape,
}

/// A stage's layers: one flat int8 host buffer, at most [`MAX_LIVE_LAYERS`] layers on the device.
pub struct LayerResidency {
    backend: Arc<GpuBackend>,
    flat: Vec<i8>,
    layers: Vec<Vec<Span>>,
    live: Vec<(usize, Vec<Arc<GpuWeights>>)>,
}

impl std::fmt::Debug for LayerResidency {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LayerResidency")
            .field("layers", &self.layers.len())
            .field("host_bytes", &self.flat.len())
            .field("live", &self.live_layers())
            .finish()
    }
}

impl LayerResidency {
    /// Takes the flat buffer and, per layer, the shapes of its matrices in the order they were
    /// packed (layer 0's matrices first). The shapes must cover the buffer exactly.
    pub fn new(
        backend: Arc<GpuBackend>,
        flat: Vec<i8>,
        layers: &[Vec<MatrixShape>],
    ) -> Result<LayerResidency> {
        let mut start = 0;
        let mut spans = Vec::with_capacity(layers.len());
        for (layer, shapes) in layers.iter().enumerate() {
            let mut layer_spans = Vec::with_capacity(shapes.len());
            for (matrix, &shape) in shapes.iter().enumerate() {
                let end = start + shape.n * shape.k;
                if end > flat.len() {
                    return Err(Error::ShardRange {
                        layer,
                        matrix,
                        start,
                        end,
                        len: flat.len(),
                    });
                }
                layer_spans.push(Span { start, shape });
                start = end;
            }
            spans.push(layer_spans);
        }
        if start != flat.len() {
            return Err(Error::ShapeMismatch {
                operand: "flat layer buffer",
                got: flat.len(),
                expected: start,
            });
        }
        Ok(LayerResidency {
            backend,
            flat,
            layers: spans,
            live: Vec::with_capacity(MAX_LIVE_LAYERS),
        })
    }

    /// Packs per-layer matrices (row-major int8 with their shapes) into one flat buffer.
    pub fn pack(
        backend: Arc<GpuBackend>,
        layers: &[Vec<(&[i8], MatrixShape)>],
    ) -> Result<LayerResidency> {
        let total = layers.iter().flatten().map(|(m, _)| m.len()).sum();
        let mut flat = Vec::with_capacity(total);
        let mut shapes = Vec::with_capacity(layers.len());
        for layer in layers {
            for &(m, shape) in layer {
                if m.len() != shape.n * shape.k {
                    return Err(Error::ShapeMismatch {
                        operand: "layer matrix",
                        got: m.len(),
                        expected: shape.n * shape.k,
                    });
                }
                flat.extend_from_slice(m);
            }
            shapes.push(layer.iter().map(|&(_, s)| s).collect());
        }
        LayerResidency::new(backend, flat, &shapes)
    }

    /// Number of layers in the stage.
    pub fn layers(&self) -> usize {
        self.layers.len()
    }

    /// Bytes of the flat host buffer.
    pub fn host_bytes(&self) -> usize {
        self.flat.len()
    }

    /// The row-major int8 bytes of one matrix in the flat buffer.
    pub fn host_matrix(&self, layer: usize, matrix: usize) -> Option<(&[i8], MatrixShape)> {
        let span = self.layers.get(layer)?.get(matrix)?;
        let len = span.shape.n * span.shape.k;
        Some((&self.flat[span.start..span.start + len], span.shape))
    }

    /// The layers on the device now, in the order they became live.
    pub fn live_layers(&self) -> Vec<usize> {
        self.live.iter().map(|(l, _)| *l).collect()
    }

    /// Makes `layer` live (uploads it unless it already is). A third live layer is refused.
    pub fn acquire(&mut self, layer: usize) -> Result<()> {
        let Some(spans) = self.layers.get(layer) else {
            return Err(Error::LayerOutOfRange {
                layer,
                layers: self.layers.len(),
            });
        };
        if self.live.iter().any(|(l, _)| *l == layer) {
            return Ok(());
        }
        if let [(first, _), (second, _)] = self.live.as_slice() {
            return Err(Error::ThirdLiveLayer {
                requested: layer,
                live: [*first, *second],
            });
        }
        let mut weights = Vec::with_capacity(spans.len());
        for span in spans {
            let len = span.shape.n * span.shape.k;
            let bytes = &self.flat[span.start..span.start + len];
            weights.push(Arc::new(self.backend.upload(
                bytes,
                span.shape.n,
                span.shape.k,
            )?));
        }
        self.live.push((layer, weights));
        Ok(())
    }

    /// Drops `layer` from the device, except in a single-layer stage, which stays resident.
    pub fn release(&mut self, layer: usize) {
        if self.layers.len() == 1 {
            return;
        }
        self.live.retain(|(l, _)| *l != layer);
    }

    /// The device weights of a live layer, one per matrix in packing order. A clone of an `Arc`
    /// keeps its buffer alive past [`LayerResidency::release`]; drop it when the layer is done.
    pub fn weights(&self, layer: usize) -> Option<&[Arc<GpuWeights>]> {
        self.live
            .iter()
            .find(|(l, _)| *l == layer)
            .map(|(_, w)| w.as_slice())
    }

    /// The streaming step before running `layer`: makes it live and queues the upload of
    /// `layer + 1`. Returns `layer`'s device weights.
    ///
    /// The upload does not block the host: `wgpu` copies the bytes into a staging buffer at once and
    /// the device copy runs on the queue ahead of `layer`'s first GEMM, so the host goes on preparing
    /// `layer`'s inputs meanwhile. (wgpu exposes one queue, so the device-side copy and `layer`'s
    /// kernels do not run concurrently.)
    pub fn begin(&mut self, layer: usize) -> Result<&[Arc<GpuWeights>]> {
        self.acquire(layer)?;
        if layer + 1 < self.layers.len() {
            self.acquire(layer + 1)?;
        }
        self.weights(layer).ok_or(Error::LayerOutOfRange {
            layer,
            layers: self.layers.len(),
        })
    }

    /// The streaming step after running `layer`: drops it (a single-layer stage keeps it).
    pub fn end(&mut self, layer: usize) {
        self.release(layer);
    }

    /// The backend the layers are uploaded to.
    pub fn backend(&self) -> &Arc<GpuBackend> {
        &self.backend
    }
}
