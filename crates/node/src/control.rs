//! What the head and the members share about the ring: `wire` messages on a link, the facts a device
//! announces about itself, and the probe.

use std::sync::Arc;

use anyhow::{Context, Result, bail};
use daisy_gemm_int8::Backend;
use daisy_wire::{Hash, Message, decode, encode};

use crate::rtc::Link;

/// The seed of the probe every device runs in its Hello; the head sends fresh seeds after it.
pub(crate) const HELLO_PROBE_SEED: u64 = 0x5eed_da15_c4a1;

/// Send one `wire` message.
pub(crate) async fn send(link: &Link, message: &Message) -> Result<()> {
    link.send(&encode(message))
        .await
        .with_context(|| format!("sending {}", message.kind()))
}

/// The next `wire` message, decoded and validated; `None` when the link closed.
pub(crate) async fn recv(link: &Link) -> Result<Option<Message>> {
    match link.recv().await {
        None => Ok(None),
        Some(bytes) => Ok(Some(decode(&bytes?).context("a malformed wire message")?)),
    }
}

/// The next message, refused unless it comes within `within` and the link stays open.
pub(crate) async fn expect(
    link: &Link,
    what: &str,
    within: std::time::Duration,
) -> Result<Message> {
    match tokio::time::timeout(within, recv(link)).await {
        Err(_) => bail!("no {what} within {within:?}"),
        Ok(Ok(None)) => bail!("the link closed before its {what}"),
        Ok(r) => Ok(r?.expect("checked above")),
    }
}

/// Memory this device can give to weights: `--memory-limit` when given, else what the system
/// reports available (`MemAvailable`), else unknown.
pub(crate) fn memory_bytes(limit: Option<u64>) -> Option<u64> {
    if limit.is_some() {
        return limit;
    }
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = info.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// The probe's SHA-256 for `seed` and the measured rate in multiply-accumulates per second.
pub(crate) fn probe(backend: &Arc<dyn Backend>, seed: u64) -> Result<(Hash, f64)> {
    let hash = daisy_gemm_int8::probe(backend.as_ref(), seed).context("running the probe")?;
    let gops = daisy_gemm_int8::measure_rate(backend.as_ref()).context("measuring the rate")?;
    Ok((Hash(hash), gops * 1e9 / 2.0))
}

/// `text` in the grammar the wire's names share (letters, digits, `.`, `_`, `-`; any other
/// character becomes `-`), cut to `max` characters, without leading or trailing `.`, `_` or `-`;
/// `fallback` when nothing is left.
pub(crate) fn clean_name(text: &str, max: usize, fallback: &str) -> String {
    let clean: String = text
        .trim()
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "._-".contains(c) {
                c
            } else {
                '-'
            }
        })
        .take(max)
        .collect();
    let clean = clean.trim_matches(['.', '-', '_']);
    if clean.is_empty() {
        fallback.to_string()
    } else {
        clean.to_string()
    }
}

/// A name for this device: the host name and the process id, in the wire's device-id grammar.
pub(crate) fn default_device_name() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_default();
    format!("{}-{}", clean_name(&host, 40, "device"), std::process::id())
}
