//! The Hugging Face cache layout: `models--org--name/refs/<rev>` → `snapshots/<commit>/`, files
//! as symbolic links into `blobs/`, and the fingerprint's dependence on repo id and commit.

use std::path::Path;

use daisy_loader::{Checkpoint, LocalDir, find_in_cache, parse_model_ref, revision_of};

use crate::root;

fn make_cache(cache: &Path, commit: &str) {
    let repo = cache.join("models--tiny-org--tiny-llama");
    let snap = repo.join("snapshots").join(commit);
    std::fs::create_dir_all(&snap).unwrap();
    std::fs::create_dir_all(repo.join("refs")).unwrap();
    std::fs::create_dir_all(repo.join("blobs")).unwrap();
    std::fs::write(repo.join("refs").join("main"), format!("{commit}\n")).unwrap();
    let src = root().join("fixtures/tiny/llama");
    for entry in std::fs::read_dir(&src).unwrap() {
        let entry = entry.unwrap();
        let blob = repo.join("blobs").join(entry.file_name());
        std::fs::copy(entry.path(), &blob).unwrap();
        #[cfg(unix)]
        std::os::unix::fs::symlink(&blob, snap.join(entry.file_name())).unwrap();
        #[cfg(not(unix))]
        std::fs::copy(&blob, snap.join(entry.file_name())).unwrap();
    }
}

#[test]
fn refs_resolve_to_snapshots_and_enter_the_fingerprint() {
    let tmp = tempfile::tempdir().unwrap();
    let commit = "0123456789abcdef0123456789abcdef01234567";
    make_cache(tmp.path(), commit);

    let id = parse_model_ref("tiny-org/tiny-llama").unwrap();
    assert_eq!(revision_of(&id), "main");
    let snap = find_in_cache(tmp.path(), &id).unwrap();
    assert_eq!(snap.commit, commit);
    let by_commit = find_in_cache(
        tmp.path(),
        &parse_model_ref(&format!("tiny-org/tiny-llama@{commit}")).unwrap(),
    );
    assert_eq!(by_commit.unwrap().dir, snap.dir);

    let cached = Checkpoint::from_repo(
        Box::new(LocalDir::new(&snap.dir)),
        id.repo.as_str(),
        &snap.commit,
    )
    .unwrap();
    let local = Checkpoint::open(&root().join("fixtures/tiny/llama").to_string_lossy()).unwrap();
    assert_eq!(cached.config(), local.config());
    // Same bytes, different identity: the repo id and commit are part of the fingerprint.
    assert_ne!(cached.fingerprint(), local.fingerprint());
    let other = Checkpoint::from_repo(Box::new(LocalDir::new(&snap.dir)), id.repo.as_str(), "ffff")
        .unwrap();
    assert_ne!(cached.fingerprint(), other.fingerprint());
    let again = Checkpoint::from_repo(
        Box::new(LocalDir::new(&snap.dir)),
        id.repo.as_str(),
        &snap.commit,
    )
    .unwrap();
    assert_eq!(cached.fingerprint(), again.fingerprint());

    let missing = find_in_cache(
        tmp.path(),
        &parse_model_ref("tiny-org/tiny-llama@v2").unwrap(),
    );
    let msg = missing.unwrap_err().to_string();
    assert!(
        msg.contains("tiny-org/tiny-llama") && msg.contains("v2"),
        "{msg}"
    );
}

#[test]
fn repo_ids_are_refused_when_malformed() {
    for bad in [
        "noslash",
        "a/b/c",
        "../x",
        "org/..",
        "org/name@",
        "org/na me",
        "org/name@../../x",
    ] {
        let err = parse_model_ref(bad).unwrap_err().to_string();
        assert!(err.contains(bad), "{bad}: {err}");
    }
    assert_eq!(
        revision_of(&parse_model_ref("HuggingFaceTB/SmolLM2-135M@v1.0").unwrap()),
        "v1.0"
    );
}
