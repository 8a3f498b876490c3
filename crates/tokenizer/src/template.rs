//! Chat templates from `tokenizer_config.json`, rendered with `minijinja` the way `transformers`
//! renders them (`transformers/utils/chat_template_utils.py`): `trim_blocks` and `lstrip_blocks`,
//! loop controls, the variables `messages`, `add_generation_prompt` and the special tokens
//! (`bos_token`, `eos_token`, `unk_token`, `sep_token`, `pad_token`, `cls_token`, `mask_token`:
//! `transformers`' `special_tokens_map`), a `raise_exception` function and a
//! `tojson` filter that writes what Python's `json.dumps(x, ensure_ascii=False)` writes.
//!
//! This differs from `transformers` in what it leaves out: tools, documents, `strftime_now` and the
//! Python string methods some templates call; a template that uses them fails to render.

use std::collections::BTreeMap;

use minijinja::value::Kwargs;
use minijinja::{Environment, ErrorKind, Value};
use serde::Serialize;

use crate::Error;

/// One chat message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Message {
    /// `system`, `user` or `assistant`.
    pub role: String,
    /// The message text.
    pub content: String,
}

/// A chat template and the special tokens it may refer to.
#[derive(Debug)]
pub struct ChatTemplate {
    env: Environment<'static>,
    special: BTreeMap<&'static str, String>,
}

fn template_err(e: impl std::fmt::Display) -> Error {
    Error::Template(e.to_string())
}

/// A special-token entry of `tokenizer_config.json`: a string or an added-token object.
fn special_token(v: &serde_json::Value) -> Option<String> {
    match v {
        serde_json::Value::String(s) => Some(s.clone()),
        serde_json::Value::Object(o) => {
            o.get("content").and_then(|c| c.as_str()).map(str::to_owned)
        }
        _ => None,
    }
}

impl ChatTemplate {
    /// Reads the chat template of a `tokenizer_config.json`; `Ok(None)` when it has none. A list of
    /// named templates yields the one named `default`.
    pub fn from_tokenizer_config(bytes: &[u8]) -> Result<Option<ChatTemplate>, Error> {
        let cfg: serde_json::Value = serde_json::from_slice(bytes)
            .map_err(|e| Error::Template(format!("tokenizer_config.json is not JSON: {e}")))?;
        let source = match cfg.get("chat_template") {
            None | Some(serde_json::Value::Null) => return Ok(None),
            Some(serde_json::Value::String(s)) => s.clone(),
            Some(serde_json::Value::Array(list)) => {
                let found = list
                    .iter()
                    .find(|t| t.get("name").and_then(|n| n.as_str()) == Some("default"));
                match found
                    .and_then(|t| t.get("template"))
                    .and_then(|t| t.as_str())
                {
                    Some(s) => s.to_owned(),
                    None => {
                        return Err(Error::Template(
                            "chat_template list has no template named \"default\"".into(),
                        ));
                    }
                }
            }
            Some(other) => {
                return Err(Error::Template(format!(
                    "chat_template is {other}, expected a string or a list"
                )));
            }
        };
        let mut special = BTreeMap::new();
        for key in [
            "bos_token",
            "eos_token",
            "unk_token",
            "sep_token",
            "pad_token",
            "cls_token",
            "mask_token",
        ] {
            if let Some(v) = cfg.get(key).and_then(special_token) {
                special.insert(key, v);
            }
        }
        Ok(Some(ChatTemplate::new(source, special)?))
    }

    /// A template from its source and the special tokens it may refer to.
    pub fn new(
        source: String,
        special: BTreeMap<&'static str, String>,
    ) -> Result<ChatTemplate, Error> {
        let mut env = Environment::new();
        let syntax = minijinja::syntax::SyntaxConfig::builder()
            .trim_blocks(true)
            .lstrip_blocks(true)
            .keep_trailing_newline(false)
            .build()
            .map_err(template_err)?;
        env.set_syntax(syntax);
        env.add_function(
            "raise_exception",
            |message: String| -> Result<Value, minijinja::Error> {
                Err(minijinja::Error::new(ErrorKind::InvalidOperation, message))
            },
        );
        env.add_filter("tojson", tojson);
        env.add_template_owned("chat", source)
            .map_err(template_err)?;
        Ok(ChatTemplate { env, special })
    }

    /// Renders a conversation, as `apply_chat_template(messages, tokenize=False,
    /// add_generation_prompt=…)` does.
    pub fn render(
        &self,
        messages: &[Message],
        add_generation_prompt: bool,
    ) -> Result<String, Error> {
        let tmpl = self.env.get_template("chat").map_err(template_err)?;
        let mut ctx: BTreeMap<&str, Value> = BTreeMap::new();
        for (k, v) in &self.special {
            ctx.insert(k, Value::from(v.as_str()));
        }
        ctx.insert("messages", Value::from(minijinja::value::Serde(messages)));
        ctx.insert("add_generation_prompt", Value::from(add_generation_prompt));
        tmpl.render(Value::from(minijinja::value::Serde(&ctx)))
            .map_err(|e| {
                let mut msg = e.to_string();
                let mut src = std::error::Error::source(&e);
                while let Some(s) = src {
                    msg.push_str(&format!(": {s}"));
                    src = s.source();
                }
                Error::Template(msg)
            })
    }
}

/// `json.dumps(x, ensure_ascii=False, indent=indent, separators=separators, sort_keys=sort_keys)`.
fn tojson(value: Value, kwargs: Kwargs) -> Result<Value, minijinja::Error> {
    let indent: Option<usize> = kwargs.get("indent")?;
    let sort_keys: Option<bool> = kwargs.get("sort_keys")?;
    let separators: Option<Vec<String>> = kwargs.get("separators")?;
    kwargs.assert_all_used()?;
    let (item_sep, key_sep) = match separators.as_deref() {
        Some([a, b]) => (a.clone(), b.clone()),
        Some(_) => {
            return Err(minijinja::Error::new(
                ErrorKind::InvalidOperation,
                "separators must be a pair",
            ));
        }
        None if indent.is_some() => (",".to_owned(), ": ".to_owned()),
        None => (", ".to_owned(), ": ".to_owned()),
    };
    let mut out = String::new();
    dump(
        &value,
        &mut out,
        indent,
        0,
        &item_sep,
        &key_sep,
        sort_keys.unwrap_or(false),
    )?;
    Ok(Value::from_safe_string(out))
}

fn dump(
    v: &Value,
    out: &mut String,
    indent: Option<usize>,
    level: usize,
    item_sep: &str,
    key_sep: &str,
    sort: bool,
) -> Result<(), minijinja::Error> {
    use minijinja::value::ValueKind;
    let newline = |out: &mut String, level: usize| {
        if let Some(n) = indent {
            out.push('\n');
            out.push_str(&" ".repeat(n * level));
        }
    };
    let string = |s: &str| serde_json::Value::String(s.to_owned()).to_string();
    match v.kind() {
        ValueKind::Undefined | ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if v.is_true() { "true" } else { "false" }),
        ValueKind::Number => out.push_str(&v.to_string()),
        ValueKind::String => out.push_str(&string(v.as_str().unwrap_or_default())),
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Vec<Value> = v.try_iter()?.collect();
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(item_sep);
                }
                newline(out, level + 1);
                dump(item, out, indent, level + 1, item_sep, key_sep, sort)?;
            }
            if !items.is_empty() {
                newline(out, level);
            }
            out.push(']');
        }
        ValueKind::Map => {
            // Insertion order, as Python dicts keep it, unless sort_keys.
            let mut keys: Vec<Value> = v.try_iter()?.collect();
            if sort {
                keys.sort_by_key(|k| k.to_string());
            }
            out.push('{');
            for (i, key) in keys.iter().enumerate() {
                if i > 0 {
                    out.push_str(item_sep);
                }
                newline(out, level + 1);
                out.push_str(&string(&key.to_string()));
                out.push_str(key_sep);
                dump(
                    &v.get_item(key)?,
                    out,
                    indent,
                    level + 1,
                    item_sep,
                    key_sep,
                    sort,
                )?;
            }
            if !keys.is_empty() {
                newline(out, level);
            }
            out.push('}');
        }
        other => {
            return Err(minijinja::Error::new(
                ErrorKind::InvalidOperation,
                format!("tojson cannot write a {other} value"),
            ));
        }
    }
    Ok(())
}
