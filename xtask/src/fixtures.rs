//! `cargo xtask fixtures`.

pub(crate) fn run(_args: &[String]) -> anyhow::Result<()> {
    anyhow::bail!("`cargo xtask fixtures` is not built yet")
}
