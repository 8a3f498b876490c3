//! The plan: which contiguous range of layers each stage of the ring holds, and its structural rules
//! (DESIGN §4). `ring` builds plans; this crate owns the type so decoding can refuse a bad one.

use std::fmt;
use std::ops::Range;

use serde::{Deserialize, Serialize};

use crate::Error;

/// One stage of the ring: the layers it runs, `layers.start..layers.end`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct StageSpan {
    pub layers: Range<usize>,
}

impl StageSpan {
    /// How many layers the stage holds (0 for a reversed range).
    pub fn len(&self) -> usize {
        self.layers.end.saturating_sub(self.layers.start)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// One way a list of stages breaks the plan rules.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Violation {
    /// The model has no layers.
    NoLayers,
    /// The plan has no stages (not even the head).
    NoStages,
    /// A stage's range ends before it starts.
    Reversed { stage: usize, layers: Range<usize> },
    /// Layers between the previous stage's end and this stage's start belong to nobody.
    Gap { stage: usize, missing: Range<usize> },
    /// This stage starts inside the previous stage's range.
    Overlap { stage: usize, shared: Range<usize> },
    /// This stage starts before the previous stage started: stages are not in ring order.
    OutOfOrder {
        stage: usize,
        layers: Range<usize>,
        previous: Range<usize>,
    },
    /// A stage other than the head holds no layers.
    EmptyStage { stage: usize },
    /// A stage reaches past the model's last layer.
    Beyond {
        stage: usize,
        end: usize,
        n_layers: usize,
    },
    /// The last stage ends before the model's last layer.
    Uncovered { missing: Range<usize> },
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NoLayers => write!(f, "the model has 0 layers, expected at least 1"),
            Self::NoStages => write!(f, "no stages, expected at least the head"),
            Self::Reversed { stage, layers } => {
                write!(
                    f,
                    "stage {stage} has layers {layers:?}, which end before they start"
                )
            }
            Self::Gap { stage, missing } => {
                write!(
                    f,
                    "gap before stage {stage}: layers {missing:?} belong to no stage"
                )
            }
            Self::Overlap { stage, shared } => {
                write!(
                    f,
                    "stage {stage} overlaps the stage before it on layers {shared:?}"
                )
            }
            Self::OutOfOrder {
                stage,
                layers,
                previous,
            } => write!(
                f,
                "stage {stage} holds layers {layers:?}, before the previous stage's {previous:?}: \
                 stages must be in ring order"
            ),
            Self::EmptyStage { stage } => {
                write!(
                    f,
                    "stage {stage} holds no layers; only the head (stage 0) may"
                )
            }
            Self::Beyond {
                stage,
                end,
                n_layers,
            } => {
                write!(
                    f,
                    "stage {stage} ends at layer {end}, past the model's {n_layers} layers"
                )
            }
            Self::Uncovered { missing } => {
                write!(f, "layers {missing:?} at the end belong to no stage")
            }
        }
    }
}

/// Every violation of a refused plan, for error messages.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Violations(pub Vec<Violation>);

impl fmt::Display for Violations {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, v) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            write!(f, "{v}")?;
        }
        Ok(())
    }
}

/// Checks `stages` against the plan rules for a model of `n_layers` layers: stages in ring order,
/// stage 0 the head, layers `0..n_layers` covered exactly once, in order, as contiguous ranges, and
/// only the head may hold zero layers. Returns every violation, not just the first.
pub fn validate_stages(n_layers: usize, stages: &[StageSpan]) -> Result<(), Vec<Violation>> {
    let mut found = Vec::new();
    if n_layers == 0 {
        found.push(Violation::NoLayers);
    }
    if stages.is_empty() {
        found.push(Violation::NoStages);
        return Err(found);
    }
    let mut expected = 0usize;
    let mut previous: Option<&Range<usize>> = None;
    for (i, stage) in stages.iter().enumerate() {
        let Range { start, end } = stage.layers.clone();
        if end < start {
            found.push(Violation::Reversed {
                stage: i,
                layers: start..end,
            });
        }
        if start > expected {
            found.push(Violation::Gap {
                stage: i,
                missing: expected..start,
            });
        } else if start < expected {
            match previous {
                Some(prev) if start < prev.start => found.push(Violation::OutOfOrder {
                    stage: i,
                    layers: start..end,
                    previous: prev.clone(),
                }),
                _ => found.push(Violation::Overlap {
                    stage: i,
                    shared: start..expected.min(end.max(start)),
                }),
            }
        }
        if i > 0 && start == end {
            found.push(Violation::EmptyStage { stage: i });
        }
        if end > n_layers {
            found.push(Violation::Beyond {
                stage: i,
                end,
                n_layers,
            });
        }
        expected = end;
        previous = Some(&stage.layers);
    }
    if expected < n_layers {
        found.push(Violation::Uncovered {
            missing: expected..n_layers,
        });
    }
    if found.is_empty() { Ok(()) } else { Err(found) }
}

/// A plan that passed [`validate_stages`]: stages in ring order, stage 0 the head.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize)]
pub struct Plan {
    n_layers: usize,
    stages: Vec<StageSpan>,
}

impl Plan {
    /// A plan over `n_layers` layers, refused with every violation when the stages break the rules.
    pub fn new(n_layers: usize, stages: Vec<StageSpan>) -> Result<Self, Error> {
        validate_stages(n_layers, &stages).map_err(|v| Error::Plan(Violations(v)))?;
        Ok(Self { n_layers, stages })
    }

    /// A plan from per-stage layer counts, head first (`--stages 10,10,10`), for a model of
    /// `n_layers` layers.
    pub fn from_counts(counts: &[usize], n_layers: usize) -> Result<Self, Error> {
        let mut start = 0usize;
        let stages = counts
            .iter()
            .map(|&c| {
                let end = start.saturating_add(c);
                let stage = StageSpan { layers: start..end };
                start = end;
                stage
            })
            .collect();
        Self::new(n_layers, stages)
    }

    /// The head alone holding every layer.
    pub fn single(n_layers: usize) -> Result<Self, Error> {
        Self::new(
            n_layers,
            vec![StageSpan {
                layers: 0..n_layers,
            }],
        )
    }

    pub fn n_layers(&self) -> usize {
        self.n_layers
    }

    /// The stages in ring order; `stages()[0]` is the head.
    pub fn stages(&self) -> &[StageSpan] {
        &self.stages
    }

    /// Number of stages (at least 1).
    pub fn len(&self) -> usize {
        self.stages.len()
    }

    /// Always false: a plan has at least the head.
    pub fn is_empty(&self) -> bool {
        self.stages.is_empty()
    }

    /// Layer count of each stage, head first.
    pub fn counts(&self) -> Vec<usize> {
        self.stages.iter().map(StageSpan::len).collect()
    }

    /// The stage holding `layer`, if any.
    pub fn stage_of(&self, layer: usize) -> Option<usize> {
        self.stages.iter().position(|s| s.layers.contains(&layer))
    }
}

impl fmt::Display for Plan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, c) in self.counts().iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{c}")?;
        }
        Ok(())
    }
}
