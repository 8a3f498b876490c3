//! One module per subcommand.

pub(crate) mod mirror;
pub(crate) mod tokenize;
