//! A local file's byte range memory-mapped: the bytes a positional read gives, past-the-end ranges
//! refused, pages given back and read again unchanged; the checkpoint maps a stored tensor and
//! declines one it must transform.

use daisy_loader::{ByteSource, Checkpoint, FileSource};

use crate::root;

#[test]
fn a_mapped_range_holds_the_bytes_a_read_gives() {
    let path = root().join("fixtures/tiny/llama/model.safetensors");
    let src = FileSource::open(&path).unwrap();
    let len = src.len().unwrap();
    // An offset off any page boundary and a range across several pages.
    let (offset, n) = (4099u64, 3 * 4096 + 17);
    let read = src.read_at(offset, n).unwrap();
    let map = src.map(offset, n).expect("a local file maps").unwrap();
    assert_eq!(map.bytes(), &read[..]);
    map.release(100..9000);
    assert_eq!(map.bytes(), &read[..], "released pages read back the same");
    let e = src.map(len - 3, 4).expect("a local file maps").unwrap_err();
    assert!(e.to_string().contains(&path.display().to_string()), "{e}");

    let ck = Checkpoint::open(&root().join("fixtures/tiny/llama").to_string_lossy()).unwrap();
    let name = "model.embed_tokens.weight";
    let (dtype, mapped) = ck
        .map_raw(name)
        .unwrap()
        .expect("a safetensors tensor maps");
    let (read_dtype, bytes) = ck.read_raw(name).unwrap();
    assert_eq!((dtype, mapped.bytes()), (read_dtype, &bytes[..]));
    // The mutation: another tensor's bytes are not these.
    let (_, other) = ck.map_raw("lm_head.weight").unwrap().unwrap();
    assert_ne!(other.bytes(), &bytes[..]);
}
