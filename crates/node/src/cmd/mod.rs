//! One module per subcommand.

pub(crate) mod adapters;
pub(crate) mod fetch;
pub(crate) mod inspect;
pub(crate) mod mirror;
pub(crate) mod run;
pub(crate) mod score;
pub(crate) mod tokenize;
