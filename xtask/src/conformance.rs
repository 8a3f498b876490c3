//! `cargo xtask conformance`: run the conformance binary (real model splits against independent
//! goldens, and the mutation cases that must fail). Extra arguments go to the test harness as a
//! filter, e.g. `cargo xtask conformance splits`.

pub(crate) fn run(args: &[String]) -> anyhow::Result<()> {
    crate::fixtures::run(&[])?;
    let mut cmd = vec![
        "test",
        "--package",
        "daisy-conformance",
        "--test",
        "conformance",
    ];
    if !args.is_empty() {
        cmd.push("--");
        cmd.extend(args.iter().map(String::as_str));
    }
    crate::cmd("cargo", &cmd)
}
