//! `cargo xtask bench`.

pub(crate) fn run(_args: &[String]) -> anyhow::Result<()> {
    anyhow::bail!("`cargo xtask bench` is not built yet")
}
