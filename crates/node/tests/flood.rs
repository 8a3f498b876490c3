//! A thousand joins with a wrong secret while a turn runs: every one is refused (after the first
//! few, without a challenge: rate-limited), and the turn completes with `node run`'s text.

use std::io::{Read, Write};

use futures_util::{SinkExt, StreamExt};
use serde_json::Value;
use tokio_tungstenite::tungstenite::Message;

mod common;

use common::{Served, smollm2};

const ATTEMPTS: usize = 1000;
const QUESTION: &str = "What is the capital of France?";

/// A chat completion over a plain HTTP/1.1 connection: the reply's JSON body.
fn complete(base: &str, tokens: usize) -> Value {
    let host = base.strip_prefix("http://").unwrap();
    let body = serde_json::json!({
        "model": smollm2(),
        "messages": [{"role": "user", "content": QUESTION}],
        "temperature": 0,
        "max_tokens": tokens,
    })
    .to_string();
    let mut s = std::net::TcpStream::connect(host).unwrap();
    write!(
        s,
        "POST /v1/chat/completions HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut reply = String::new();
    s.read_to_string(&mut reply).unwrap();
    let (head, body) = reply.split_once("\r\n\r\n").unwrap();
    assert!(head.starts_with("HTTP/1.1 200"), "{reply}");
    serde_json::from_str(body).unwrap()
}

/// One join attempt with a made-up proof: the reason of the refusal it gets.
async fn wrong_join(url: &str) -> String {
    let (mut ws, _) = tokio_tungstenite::connect_async(url).await.unwrap();
    let first: Value = match ws.next().await {
        Some(Ok(Message::Text(t))) => serde_json::from_str(&t).unwrap(),
        other => panic!("no first signal: {other:?}"),
    };
    if first["type"] == "refused" {
        return first["reason"].as_str().unwrap().to_string();
    }
    assert_eq!(first["type"], "challenge", "{first}");
    let auth = serde_json::json!({"type": "auth", "device": "intruder", "proof": "00".repeat(32)});
    ws.send(Message::Text(auth.to_string().into()))
        .await
        .unwrap();
    match ws.next().await {
        Some(Ok(Message::Text(t))) => {
            let v: Value = serde_json::from_str(&t).unwrap();
            assert_eq!(v["type"], "refused", "{v}");
            v["reason"].as_str().unwrap().to_string()
        }
        other => panic!("no refusal: {other:?}"),
    }
}

#[test]
fn a_thousand_wrong_secrets_are_refused_and_rate_limited_while_a_turn_runs() {
    let mut head = Served::start(&smollm2(), &["--stages", "15,15"], &[]);
    head.join("member-0");
    head.wait_for("ready; serving until stopped");
    let base = head.base.clone();
    let quiet = complete(&base, 48);

    let ws_url = format!("{}/ring", base.replace("http://", "ws://"));
    let turn = {
        let base = base.clone();
        std::thread::spawn(move || complete(&base, 48))
    };
    let reasons: Vec<String> = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(async {
            let mut out = Vec::new();
            for _ in 0..ATTEMPTS {
                out.push(wrong_join(&ws_url).await);
            }
            out
        });
    let flooded = turn.join().unwrap();

    let wrong = reasons.iter().filter(|r| *r == "wrong ring secret").count();
    let limited = reasons
        .iter()
        .filter(|r| r.starts_with("rate-limited"))
        .count();
    assert_eq!(
        wrong + limited,
        ATTEMPTS,
        "every attempt refused: {:?}",
        &reasons[..5]
    );
    assert_eq!(
        wrong, 10,
        "the first ten get a challenge and a refusal, the rest none"
    );
    head.wait_for("joins with a wrong secret from 127.0.0.1");

    // The turn that ran through the flood is the quiet one's, and `node run`'s.
    let model = smollm2();
    let oracle = common::node_json(&[
        "run",
        "--model",
        &model,
        "--chat",
        "--prompt",
        QUESTION,
        "--stages",
        "15,15",
        "--max-new-tokens",
        "48",
    ]);
    let text = |v: &Value| v["choices"][0]["message"]["content"].clone();
    assert_eq!(text(&flooded), oracle["text"]);
    assert_eq!(text(&quiet), oracle["text"]);
    eprintln!(
        "flood: decode {:.1} tok/s during {ATTEMPTS} wrong joins, {:.1} tok/s without",
        flooded["timings"]["decode_tokens_per_s"].as_f64().unwrap(),
        quiet["timings"]["decode_tokens_per_s"].as_f64().unwrap()
    );
}

#[test]
fn slow_clients_holding_connections_do_not_block_others() {
    let mut head = Served::start(&smollm2(), &["--stages", "15,15"], &[]);
    head.join("member-0");
    head.wait_for("ready; serving until stopped");
    let host = head.base.strip_prefix("http://").unwrap().to_string();
    // Two hundred clients that send half a request and then nothing (a slowloris).
    let slow: Vec<std::net::TcpStream> = (0..200)
        .map(|_| {
            let mut s = std::net::TcpStream::connect(&host).unwrap();
            write!(
                s,
                "POST /v1/chat/completions HTTP/1.1\r\nHost: {host}\r\nContent-Le"
            )
            .unwrap();
            s
        })
        .collect();
    let reply = complete(&head.base, 8);
    assert!(
        reply["choices"][0]["message"]["content"].is_string(),
        "{reply}"
    );
    // And the page's state answers too.
    let mut s = std::net::TcpStream::connect(&host).unwrap();
    write!(
        s,
        "GET /api/ring HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut ring = String::new();
    s.read_to_string(&mut ring).unwrap();
    assert!(
        ring.starts_with("HTTP/1.1 200") && ring.contains("\"state\":\"ready\""),
        "{ring}"
    );
    drop(slow);
}
