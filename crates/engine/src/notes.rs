//! What the engine says on stderr while it works (a shard read, a GPU warmed), under the name of
//! the process it works in: `head: layers 0..10 read from …`, as the node's own lines are.

use std::sync::OnceLock;

static NAME: OnceLock<&'static str> = OnceLock::new();

/// Name this process's notes (`head`, `join`), once: each then goes out as `name: note`. Unnamed
/// (`node run`), a note goes out as it is.
pub fn name_notes(name: &'static str) {
    let _ = NAME.set(name);
}

/// One line on stderr, under the process's name if it has one.
pub fn note(line: std::fmt::Arguments<'_>) {
    eprintln!("{}", noted(NAME.get().copied(), line));
}

fn noted(name: Option<&str>, line: std::fmt::Arguments<'_>) -> String {
    match name {
        Some(name) => format!("{name}: {line}"),
        None => line.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_note_goes_out_under_the_process_name_if_it_has_one() {
        assert_eq!(
            noted(Some("join"), format_args!("layers {}..{}", 10, 20)),
            "join: layers 10..20"
        );
        assert_eq!(
            noted(None, format_args!("layers {}..{}", 10, 20)),
            "layers 10..20"
        );
    }
}
