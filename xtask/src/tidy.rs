//! `cargo xtask tidy`: the dependency invariants of `ARCHITECTURE.md`, checked on `cargo metadata`.
//!
//! Only declared dependencies of kind normal count (optional ones included; dev- and
//! build-dependencies do not), matched by package name, so a `rename` does not hide one. Each
//! offending dependency is one line, reported by the first rule it breaks:
//! - the async runtime and the network stack (`tokio`, `rtc`, `axum`, …) only in `node`;
//! - HTTP (`reqwest`) only in `daisy-loader`;
//! - `tokenizers` is the oracle of `daisy-tokenizer`: a dev-dependency, never a normal one;
//! - nothing async in the sync crates (`daisy-gemm-int8`, `daisy-model`, `daisy-wire`, `daisy-ring`,
//!   `daisy-engine`, `daisy-signal`);
//! - internal crates depend only on the internal crates [`INTERNAL`] allows them, and a workspace
//!   package missing from that table is itself a violation, so a new crate gets a row.
//!
//! A package of the table that is absent from the workspace is no violation.

use std::collections::BTreeSet;

use anyhow::{bail, ensure};
use serde_json::Value;

/// Only `node` knows tokio, WebRTC and the HTTP server.
const NODE_ONLY: &[&str] = &[
    "tokio",
    "rtc",
    "webrtc",
    "axum",
    "tokio-util",
    "hyper",
    "tower",
];

/// Only `daisy-loader` speaks HTTP.
const LOADER_ONLY: &[&str] = &["reqwest"];

/// Only ever a dev-dependency: the oracle, never the product.
const DEV_ONLY: &[&str] = &["tokenizers"];

/// The crates without async, and what counts as async.
const SYNC_CRATES: &[&str] = &[
    "daisy-gemm-int8",
    "daisy-model",
    "daisy-wire",
    "daisy-ring",
    "daisy-engine",
    "daisy-signal",
];
const ASYNC: &[&str] = &[
    "tokio",
    "futures",
    "futures-util",
    "async-trait",
    "async-std",
    "smol",
];

const LIBRARIES: &[&str] = &[
    "daisy-gemm-int8",
    "daisy-wgsl",
    "daisy-loader",
    "daisy-tokenizer",
    "daisy-model",
    "daisy-wire",
    "daisy-ring",
];

/// Every internal package and the internal packages it may depend on (`None`: the libraries,
/// `daisy-engine` and `daisy-signal`).
const INTERNAL: &[(&str, Option<&[&str]>)] = &[
    ("daisy-gemm-int8", Some(&[])),
    ("daisy-wgsl", Some(&["daisy-gemm-int8", "daisy-model"])),
    ("daisy-loader", Some(&["daisy-wire"])),
    ("daisy-tokenizer", Some(&[])),
    ("daisy-model", Some(&["daisy-loader", "daisy-gemm-int8"])),
    ("daisy-wire", Some(&[])),
    ("daisy-ring", Some(&["daisy-wire"])),
    ("daisy-engine", Some(LIBRARIES)),
    ("daisy-signal", Some(&["daisy-wire"])),
    ("node", None),
    ("daisy-conformance", None),
    ("xtask", None),
];

/// What a `None` row of [`INTERNAL`] allows.
fn libraries_and_engine() -> impl Iterator<Item = &'static str> {
    LIBRARIES
        .iter()
        .copied()
        .chain(["daisy-engine", "daisy-signal"])
}

pub(crate) fn run(args: &[String]) -> anyhow::Result<()> {
    if let Some(extra) = args.first() {
        bail!("`tidy` takes no arguments, got `{extra}`");
    }
    let found = violations(&crate::metadata()?);
    for line in &found {
        println!("{line}");
    }
    ensure!(
        found.is_empty(),
        "tidy: {} dependency violation(s) of ARCHITECTURE.md",
        found.len()
    );
    eprintln!("tidy: no dependency violations");
    Ok(())
}

/// Every violation of the rules above among the workspace packages of `metadata` (the JSON of
/// `cargo metadata --format-version 1`), one line each, sorted.
pub(crate) fn violations(metadata: &Value) -> Vec<String> {
    let members: BTreeSet<&str> = metadata["workspace_members"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    let packages: Vec<&Value> = metadata["packages"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|p| p["id"].as_str().is_some_and(|id| members.contains(id)))
        .collect();
    let workspace: BTreeSet<&str> = packages.iter().filter_map(|p| p["name"].as_str()).collect();

    let mut found = Vec::new();
    for package in packages {
        let Some(name) = package["name"].as_str() else {
            continue;
        };
        let row = INTERNAL.iter().find(|(n, _)| *n == name);
        if row.is_none() {
            found.push(format!(
                "{name}: a workspace package missing from the dependency table of xtask/src/tidy.rs"
            ));
        }
        let normal = package["dependencies"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|d| d["kind"].is_null())
            .filter_map(|d| d["name"].as_str());
        for dep in normal {
            let internal = workspace.contains(dep) || INTERNAL.iter().any(|(n, _)| *n == dep);
            if let Some(why) = broken_rule(name, row.map(|(_, allowed)| *allowed), dep, internal) {
                found.push(format!("{name} -> {dep}: {why}"));
            }
        }
    }
    found.sort();
    found.dedup();
    found
}

/// The first rule that `package` depending on `dep` breaks. `allowed` is the package's row of
/// [`INTERNAL`] (absent for a package missing from it, which is reported on its own).
fn broken_rule(
    package: &str,
    allowed: Option<Option<&[&str]>>,
    dep: &str,
    internal: bool,
) -> Option<String> {
    if NODE_ONLY.contains(&dep) && package != "node" {
        return Some(format!("only node may depend on {dep}"));
    }
    if LOADER_ONLY.contains(&dep) && package != "daisy-loader" {
        return Some(format!("only daisy-loader may depend on {dep}"));
    }
    if DEV_ONLY.contains(&dep) {
        return Some(format!("{dep} may only be a dev-dependency"));
    }
    if SYNC_CRATES.contains(&package) && ASYNC.contains(&dep) {
        return Some(format!("{package} has no async"));
    }
    if !internal {
        return None;
    }
    let allowed: Vec<&str> = match allowed? {
        Some(list) => list.to_vec(),
        None => libraries_and_engine().collect(),
    };
    if allowed.contains(&dep) {
        return None;
    }
    Some(if allowed.is_empty() {
        format!("{package} may depend on no internal crate")
    } else {
        format!(
            "{package} may depend only on the internal crates {}",
            allowed.join(", ")
        )
    })
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::violations;

    /// A declared dependency: name, kind (`None` for normal, `Some("dev")`, …), optional.
    type Dep<'a> = (&'a str, Option<&'a str>, bool);

    /// Metadata in the shape of `cargo metadata --format-version 1`, every package a workspace
    /// member.
    fn metadata(packages: &[(&str, &[Dep<'_>])]) -> Value {
        let id = |name: &str| format!("path+file:///ws/{name}#0.1.0");
        let packages: Vec<Value> = packages
            .iter()
            .map(|(name, deps)| {
                let deps: Vec<Value> = deps
                    .iter()
                    .map(|(dep, kind, optional)| {
                        json!({"name": dep, "kind": kind, "optional": optional, "rename": null})
                    })
                    .collect();
                json!({"name": name, "id": id(name), "dependencies": deps})
            })
            .collect();
        let members: Vec<String> = packages
            .iter()
            .map(|p| p["id"].as_str().unwrap().to_string())
            .collect();
        json!({"packages": packages, "workspace_members": members, "version": 1})
    }

    const NORMAL: Option<&str> = None;
    const DEV: Option<&str> = Some("dev");

    /// The workspace as ARCHITECTURE.md draws it, `daisy-engine` included.
    fn clean() -> Value {
        metadata(&[
            ("daisy-gemm-int8", &[("rayon", NORMAL, false)]),
            (
                "daisy-wgsl",
                &[
                    ("daisy-gemm-int8", NORMAL, false),
                    ("daisy-model", NORMAL, false),
                ],
            ),
            (
                "daisy-loader",
                &[("reqwest", NORMAL, true), ("daisy-wire", NORMAL, false)],
            ),
            (
                "daisy-tokenizer",
                &[("fancy-regex", NORMAL, false), ("tokenizers", DEV, false)],
            ),
            (
                "daisy-model",
                &[
                    ("daisy-loader", NORMAL, false),
                    ("daisy-gemm-int8", NORMAL, false),
                    ("tokio", DEV, false),
                ],
            ),
            ("daisy-wire", &[("postcard", NORMAL, false)]),
            ("daisy-ring", &[("daisy-wire", NORMAL, false)]),
            (
                "daisy-signal",
                &[("daisy-wire", NORMAL, false), ("serde_json", NORMAL, false)],
            ),
            (
                "daisy-engine",
                &[
                    ("daisy-model", NORMAL, false),
                    ("daisy-tokenizer", NORMAL, false),
                    ("daisy-ring", NORMAL, false),
                    ("rayon", NORMAL, false),
                ],
            ),
            (
                "node",
                &[
                    ("daisy-engine", NORMAL, false),
                    ("daisy-wgsl", NORMAL, false),
                    ("daisy-signal", NORMAL, false),
                    ("tokio", NORMAL, false),
                    ("axum", NORMAL, false),
                    ("futures-util", NORMAL, false),
                ],
            ),
            (
                "daisy-conformance",
                &[
                    ("daisy-engine", NORMAL, false),
                    ("daisy-model", NORMAL, false),
                    ("node", DEV, false),
                ],
            ),
            (
                "xtask",
                &[
                    ("daisy-loader", NORMAL, false),
                    ("serde_json", NORMAL, false),
                ],
            ),
        ])
    }

    #[test]
    fn clean_workspace_has_no_violations() {
        assert_eq!(violations(&clean()), Vec::<String>::new());
    }

    #[test]
    fn absent_packages_are_no_violation() {
        let meta = metadata(&[
            ("daisy-wire", &[]),
            ("daisy-ring", &[("daisy-wire", NORMAL, false)]),
        ]);
        assert_eq!(violations(&meta), Vec::<String>::new());
    }

    #[test]
    fn forbidden_dependencies_are_reported() {
        let meta = metadata(&[
            (
                "daisy-model",
                &[("tokio", NORMAL, true), ("daisy-loader", NORMAL, false)],
            ),
            ("daisy-conformance", &[("node", NORMAL, false)]),
            ("daisy-wire", &[("reqwest", NORMAL, false)]),
            ("daisy-ring", &[("futures", NORMAL, false)]),
            ("daisy-tokenizer", &[("tokenizers", NORMAL, false)]),
            ("daisy-loader", &[("daisy-model", NORMAL, false)]),
            ("xtask", &[("hyper", NORMAL, true)]),
            ("daisy-extra", &[]),
        ]);
        assert_eq!(
            violations(&meta),
            [
                "daisy-conformance -> node: daisy-conformance may depend only on the internal crates \
                 daisy-gemm-int8, daisy-wgsl, daisy-loader, daisy-tokenizer, daisy-model, daisy-wire, \
                 daisy-ring, daisy-engine, daisy-signal",
                "daisy-extra: a workspace package missing from the dependency table of xtask/src/tidy.rs",
                "daisy-loader -> daisy-model: daisy-loader may depend only on the internal crates daisy-wire",
                "daisy-model -> tokio: only node may depend on tokio",
                "daisy-ring -> futures: daisy-ring has no async",
                "daisy-tokenizer -> tokenizers: tokenizers may only be a dev-dependency",
                "daisy-wire -> reqwest: only daisy-loader may depend on reqwest",
                "xtask -> hyper: only node may depend on hyper",
            ]
        );
    }

    #[test]
    fn only_workspace_members_are_checked() {
        let mut meta = metadata(&[("daisy-wire", &[])]);
        let outside = json!({"name": "hyper-util", "id": "registry+x#hyper-util@0.1.0",
            "dependencies": [{"name": "tokio", "kind": null, "optional": false}]});
        meta["packages"].as_array_mut().unwrap().push(outside);
        assert_eq!(violations(&meta), Vec::<String>::new());
    }

    #[test]
    fn wgsl_may_not_depend_on_the_engine() {
        let meta = metadata(&[("daisy-wgsl", &[("daisy-engine", NORMAL, false)])]);
        assert_eq!(
            violations(&meta),
            [
                "daisy-wgsl -> daisy-engine: daisy-wgsl may depend only on the internal crates daisy-gemm-int8, daisy-model"
            ]
        );
    }

    #[test]
    fn gemm_may_depend_on_no_internal_crate() {
        let meta = metadata(&[("daisy-gemm-int8", &[("daisy-wire", NORMAL, false)])]);
        assert_eq!(
            violations(&meta),
            ["daisy-gemm-int8 -> daisy-wire: daisy-gemm-int8 may depend on no internal crate"]
        );
    }
}
