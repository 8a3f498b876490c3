//! One module per subcommand.

pub(crate) mod adapters;
pub(crate) mod fetch;
pub(crate) mod inspect;
pub(crate) mod mirror;
pub(crate) mod run;
pub(crate) mod score;
pub(crate) mod tokenize;

/// `--format`: `true` for `json`, `false` for `text`.
pub(crate) fn json_format(format: &str) -> anyhow::Result<bool> {
    match format {
        "text" => Ok(false),
        "json" => Ok(true),
        other => anyhow::bail!("--format `{other}`, expected text or json"),
    }
}
