//! `cargo xtask conformance`.

pub(crate) fn run(_args: &[String]) -> anyhow::Result<()> {
    anyhow::bail!("`cargo xtask conformance` is not built yet")
}
