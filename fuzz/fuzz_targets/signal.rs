//! Fuzz target: arbitrary bytes as the signaling messages an unknown peer sends the head, as a join
//! URL and as a ring secret. Nothing may panic; whatever parses must re-serialize to a message that
//! parses to itself, and no proof checks under the wrong nonce or device.
#![no_main]

use daisy_signal::{JoinUrl, Secret, Signal, member_name};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(signal) = Signal::parse(text) {
        let json = signal.to_json();
        let again = Signal::parse(&json).expect("a parsed signal re-serializes to valid JSON");
        assert_eq!(again, signal);
        if let Signal::Auth { device, proof } = &signal {
            let _ = member_name(device);
            let secret = Secret::parse("0123456789abcdef0123456789abcdef").expect("a valid secret");
            let nonce = [7u8; 32];
            let right = secret.prove(&hex(&nonce), device).expect("hex nonce");
            assert_eq!(secret.check(&nonce, device, proof), *proof == right);
            assert!(!secret.check(&[8u8; 32], device, &right));
        }
    }
    if let Ok(url) = JoinUrl::parse(text) {
        assert!(url.signal.starts_with("ws://") && url.signal.ends_with("/ring"));
        assert!(!url.signal.contains('#') && !url.base.contains('#'));
    }
    if let Ok(secret) = Secret::parse(text) {
        assert!(secret.expose().len() >= 32);
        assert!(!format!("{secret:?}").contains(secret.expose()));
    }
});

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
