//! Repo ids, revisions and the other field grammars: a table of crafted ids that must be refused, each
//! on its own row, and the real ids that must pass.

use daisy_wire::{Commit, DeviceId, Error, ModelRef, RepoId, Revision, Text};

/// Every row must be refused by `RepoId::parse`.
const REFUSED: &[(&str, &str)] = &[
    ("", "empty"),
    ("gpt2", "no org"),
    ("org/name/extra", "extra slash"),
    ("org//name", "empty part between slashes"),
    ("/name", "empty org"),
    ("org/", "empty name"),
    ("../etc/passwd", "path traversal"),
    ("org/na..me", "`..` inside"),
    ("org/..", "`..` as the name"),
    ("org/name%2Fevil", "percent-encoded slash"),
    ("org/na%20me", "percent-encoded space"),
    ("org/na me", "space"),
    (" org/name", "leading space"),
    ("org/name\n", "newline"),
    ("org/name\t", "tab"),
    ("org/na\u{0}me", "NUL"),
    ("org/na\u{7f}me", "DEL"),
    ("org/nàme", "non-ASCII letter"),
    ("org/name\u{200b}", "zero-width space"),
    ("org\\name", "backslash"),
    ("org/-name", "leading dash"),
    ("org/name-", "trailing dash"),
    ("org/.name", "leading dot"),
    ("org/name.", "trailing dot"),
    (".org/name", "org with a leading dot"),
    ("org/na--me", "`--` inside the name"),
    ("my--org/name", "`--` inside the org"),
    ("org/name.git", "`.git` suffix"),
    ("org/name@main", "revision belongs to ModelRef"),
    ("org/name?x=1", "query"),
    ("org/name#x", "fragment"),
    ("https://huggingface.co/org/name", "URL"),
];

#[test]
fn crafted_repo_ids_are_refused() {
    assert!(REFUSED.len() >= 15);
    for (id, why) in REFUSED {
        match RepoId::parse(id) {
            Err(Error::RepoId { .. }) => {}
            other => panic!("{id:?} ({why}) should be refused, got {other:?}"),
        }
    }
}

#[test]
fn overlong_parts_are_refused_at_97_and_accepted_at_96() {
    let long = "a".repeat(96);
    assert!(RepoId::parse(&format!("org/{long}")).is_ok());
    assert!(RepoId::parse(&format!("{long}/name")).is_ok());
    let too_long = "a".repeat(97);
    assert!(matches!(
        RepoId::parse(&format!("org/{too_long}")),
        Err(Error::RepoId { .. })
    ));
    assert!(matches!(
        RepoId::parse(&format!("{too_long}/name")),
        Err(Error::RepoId { .. })
    ));
}

#[test]
fn real_repo_ids_are_accepted() {
    for id in [
        "HuggingFaceTB/SmolLM2-135M-Instruct",
        "HuggingFaceTB/SmolLM-135M",
        "openai-community/gpt2",
        "Qwen/Qwen2.5-0.5B",
        "a/b",
        "_org/_name_",
        "meta-llama/Llama-3.2-1B",
        "org/v1.0-rc_2",
        "org/name.gitx",
    ] {
        let parsed = RepoId::parse(id).unwrap_or_else(|e| panic!("{id}: {e}"));
        assert_eq!(parsed.as_str(), id);
        assert_eq!(format!("{}/{}", parsed.org(), parsed.name()), id);
    }
}

#[test]
fn model_refs_split_the_revision_off() {
    let r = ModelRef::parse("Qwen/Qwen2.5-0.5B@refs/pr/1").unwrap();
    assert_eq!(r.repo.as_str(), "Qwen/Qwen2.5-0.5B");
    assert_eq!(r.revision.as_ref().map(Revision::as_str), Some("refs/pr/1"));
    assert_eq!(r.to_string(), "Qwen/Qwen2.5-0.5B@refs/pr/1");
    assert_eq!(ModelRef::parse("a/b").unwrap().revision, None);
    assert!(ModelRef::parse("a/b@12fd25f77366fa6b3b4b768ec3050bf629380bac").is_ok());
    for bad in [
        "a/b@",
        "a/b@../x",
        "a/b@a b",
        "a/b@x@y",
        "a/b@/main",
        "a/b@main/",
        "a/b@-x",
        "a/b@x.lock",
        "a/b@a//b",
        "a/b@%2e",
    ] {
        assert!(
            matches!(ModelRef::parse(bad), Err(Error::Revision { .. })),
            "{bad:?}"
        );
    }
    assert!(matches!(
        ModelRef::parse("a/b/c@main"),
        Err(Error::RepoId { .. })
    ));
}

#[test]
fn commits_device_ids_and_texts_follow_their_grammars() {
    assert!(Commit::parse("12fd25f77366fa6b3b4b768ec3050bf629380bac").is_ok());
    assert!(Commit::parse(&"0".repeat(64)).is_ok());
    for bad in [
        "main",
        "12FD25F77366FA6B3B4B768EC3050BF629380BAC",
        "12fd25f",
        &"0".repeat(41),
        "",
    ] {
        assert!(
            matches!(Commit::parse(bad), Err(Error::Commit { .. })),
            "{bad:?}"
        );
    }
    assert!(DeviceId::parse("peer-1.local_x").is_ok());
    for bad in ["", "a b", "a/b", &"x".repeat(65), "é"] {
        assert!(
            matches!(DeviceId::parse(bad), Err(Error::DeviceId { .. })),
            "{bad:?}"
        );
    }
    assert!(Text::new("wgpu: NVIDIA GeForce — Vulkan").is_ok());
    assert!(matches!(Text::new("two\nlines"), Err(Error::Text { .. })));
    assert!(matches!(
        Text::new(&"x".repeat(1025)),
        Err(Error::Text { .. })
    ));
}
