//! Reads `tokenizer.json` into the components this crate implements, refusing every other one by name.

use serde_json::{Map, Value};

use crate::Error;
use crate::pattern::Pattern;
use crate::pretok::{Behavior, PreTokenizer};

const NORMALIZERS: &str = "expected a normalizer NFC, Sequence or none";
const PRE_TOKENIZERS: &str = "expected a pre-tokenizer ByteLevel, Split, Digits, Sequence or none";
const POST_PROCESSORS: &str = "expected a post-processor ByteLevel, TemplateProcessing or none";
const DECODERS: &str = "expected the ByteLevel decoder";
const MODELS: &str = "expected a byte-level BPE model";

/// An added token as listed in `added_tokens`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct AddedToken {
    pub(crate) content: String,
    pub(crate) single_word: bool,
    pub(crate) lstrip: bool,
    pub(crate) rstrip: bool,
    pub(crate) normalized: bool,
    pub(crate) special: bool,
}

/// The normalizers this crate implements, flattened: `Sequence` of NFC is NFC applied in order.
#[derive(Debug, Clone, Default)]
pub(crate) struct Normalizer {
    /// How many times NFC is applied (NFC is idempotent, so 0 or 1 matters).
    nfc: bool,
}

impl Normalizer {
    pub(crate) fn normalize(&self, text: &str) -> String {
        if !self.nfc {
            return text.to_owned();
        }
        use unicode_normalization::{IsNormalized, UnicodeNormalization, is_nfc_quick};
        if is_nfc_quick(text.chars()) == IsNormalized::Yes {
            return text.to_owned();
        }
        text.nfc().collect()
    }
}

/// One piece of a TemplateProcessing `single` template.
#[derive(Debug, Clone)]
pub(crate) enum TemplatePiece {
    /// `$A`: the encoded text.
    Sequence,
    /// A special token's ids.
    Special(Vec<u32>),
}

#[derive(Debug, Clone)]
pub(crate) enum PostProcessor {
    /// ByteLevel (offsets only) or none: ids pass through unchanged.
    Identity,
    Template {
        single: Vec<TemplatePiece>,
    },
}

/// The BPE model's fields.
#[derive(Debug)]
pub(crate) struct BpeConfig {
    pub(crate) vocab: Vec<(String, u32)>,
    pub(crate) merges: Vec<(String, String)>,
    pub(crate) unk_token: Option<String>,
    pub(crate) fuse_unk: bool,
    pub(crate) ignore_merges: bool,
}

#[derive(Debug)]
pub(crate) struct File {
    pub(crate) added_tokens: Vec<AddedToken>,
    pub(crate) normalizer: Normalizer,
    pub(crate) pre_tokenizers: Vec<PreTokenizer>,
    pub(crate) post_processor: PostProcessor,
    pub(crate) model: BpeConfig,
}

fn invalid(msg: impl Into<String>) -> Error {
    Error::Invalid(msg.into())
}

fn refused(what: impl Into<String>, expected: &'static str) -> Error {
    Error::Refused {
        what: what.into(),
        expected,
    }
}

fn type_of<'a>(obj: &'a Map<String, Value>, what: &str) -> Result<&'a str, Error> {
    obj.get("type")
        .and_then(Value::as_str)
        .ok_or_else(|| invalid(format!("{what} has no \"type\" string")))
}

fn bool_field(obj: &Map<String, Value>, key: &str, default: bool) -> Result<bool, Error> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(default),
        Some(Value::Bool(b)) => Ok(*b),
        Some(other) => Err(invalid(format!(
            "field {key:?} is {other}, expected a boolean"
        ))),
    }
}

fn as_object<'a>(v: &'a Value, what: &str) -> Result<&'a Map<String, Value>, Error> {
    v.as_object()
        .ok_or_else(|| invalid(format!("{what} is not an object")))
}

pub(crate) fn parse(bytes: &[u8]) -> Result<File, Error> {
    let root: Value =
        serde_json::from_slice(bytes).map_err(|e| invalid(format!("not JSON: {e}")))?;
    let root = as_object(&root, "the file")?;
    if let Some(v) = root.get("version").and_then(Value::as_str)
        && v != "1.0"
    {
        return Err(invalid(format!("version {v:?}, expected \"1.0\"")));
    }
    for key in ["truncation", "padding"] {
        if root.get(key).is_some_and(|v| !v.is_null()) {
            return Err(refused(
                format!("{key} settings"),
                "expected \"truncation\": null and \"padding\": null",
            ));
        }
    }
    let model = parse_model(root.get("model").ok_or_else(|| invalid("no \"model\""))?)?;
    let normalizer = match root.get("normalizer") {
        None | Some(Value::Null) => Normalizer::default(),
        Some(v) => parse_normalizer(v)?,
    };
    let mut pre_tokenizers = Vec::new();
    if let Some(v) = root.get("pre_tokenizer").filter(|v| !v.is_null()) {
        parse_pre_tokenizer(v, &mut pre_tokenizers)?;
    }
    match root.get("decoder") {
        None | Some(Value::Null) => return Err(refused("a missing decoder", DECODERS)),
        Some(v) => {
            let obj = as_object(v, "decoder")?;
            let t = type_of(obj, "decoder")?;
            if t != "ByteLevel" {
                return Err(refused(format!("decoder {t}"), DECODERS));
            }
        }
    }
    let added_tokens = match root.get("added_tokens") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(items)) => items.iter().map(parse_added).collect::<Result<_, _>>()?,
        Some(_) => return Err(invalid("\"added_tokens\" is not an array")),
    };
    let post_processor = match root.get("post_processor") {
        None | Some(Value::Null) => PostProcessor::Identity,
        Some(v) => parse_post(v)?,
    };
    Ok(File {
        added_tokens,
        normalizer,
        pre_tokenizers,
        post_processor,
        model,
    })
}

fn parse_added(v: &Value) -> Result<AddedToken, Error> {
    let obj = as_object(v, "an added token")?;
    let content = obj
        .get("content")
        .and_then(Value::as_str)
        .ok_or_else(|| invalid("an added token has no \"content\" string"))?
        .to_owned();
    Ok(AddedToken {
        single_word: bool_field(obj, "single_word", false)?,
        lstrip: bool_field(obj, "lstrip", false)?,
        rstrip: bool_field(obj, "rstrip", false)?,
        normalized: bool_field(obj, "normalized", true)?,
        special: bool_field(obj, "special", false)?,
        content,
    })
}

fn parse_model(v: &Value) -> Result<BpeConfig, Error> {
    let obj = as_object(v, "model")?;
    // Files written by older `tokenizers` omit the model's type; the fields then say BPE.
    let t = match obj.get("type").and_then(Value::as_str) {
        Some(t) => t,
        None if obj.contains_key("merges") => "BPE",
        None => return Err(invalid("model has no \"type\"")),
    };
    if t != "BPE" {
        return Err(refused(format!("model {t}"), MODELS));
    }
    if bool_field(obj, "byte_fallback", false)? {
        return Err(refused(
            "model BPE with byte_fallback (SentencePiece style)",
            "expected a byte-level BPE with \"byte_fallback\": false",
        ));
    }
    match obj.get("dropout") {
        None | Some(Value::Null) => {}
        Some(Value::Number(n)) if n.as_f64() == Some(0.0) => {}
        Some(other) => {
            return Err(refused(
                format!("BPE dropout {other}"),
                "expected \"dropout\": null",
            ));
        }
    }
    for key in ["continuing_subword_prefix", "end_of_word_suffix"] {
        match obj.get(key) {
            None | Some(Value::Null) => {}
            Some(Value::String(s)) if s.is_empty() => {}
            Some(other) => {
                return Err(refused(
                    format!("BPE {key} {other}"),
                    "expected a byte-level BPE without affixes",
                ));
            }
        }
    }
    let unk_token = match obj.get("unk_token") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(s.clone()),
        Some(other) => return Err(invalid(format!("unk_token is {other}, expected a string"))),
    };
    let vocab_obj = obj
        .get("vocab")
        .and_then(Value::as_object)
        .ok_or_else(|| invalid("model has no \"vocab\" object"))?;
    let mut vocab = Vec::with_capacity(vocab_obj.len());
    for (token, id) in vocab_obj {
        let id = id
            .as_u64()
            .and_then(|id| u32::try_from(id).ok())
            .ok_or_else(|| invalid(format!("vocab entry {token:?} has id {id}, expected a u32")))?;
        vocab.push((token.clone(), id));
    }
    let merges_v = obj
        .get("merges")
        .and_then(Value::as_array)
        .ok_or_else(|| invalid("model has no \"merges\" array"))?;
    let mut merges = Vec::with_capacity(merges_v.len());
    let mut rank = 0usize;
    for m in merges_v {
        match m {
            Value::String(s) => {
                if s.starts_with("#version") {
                    continue;
                }
                rank += 1;
                let parts: Vec<&str> = s.split(' ').collect();
                if parts.len() != 2 {
                    return Err(invalid(format!(
                        "merge {rank} {s:?} is not two tokens separated by one space"
                    )));
                }
                merges.push((parts[0].to_owned(), parts[1].to_owned()));
            }
            Value::Array(pair) if pair.len() == 2 && pair.iter().all(Value::is_string) => {
                rank += 1;
                let a = pair[0].as_str().unwrap_or_default().to_owned();
                let b = pair[1].as_str().unwrap_or_default().to_owned();
                merges.push((a, b));
            }
            other => {
                return Err(invalid(format!(
                    "merge {other} is neither \"a b\" nor [\"a\", \"b\"]"
                )));
            }
        }
    }
    Ok(BpeConfig {
        vocab,
        merges,
        unk_token,
        fuse_unk: bool_field(obj, "fuse_unk", false)?,
        ignore_merges: bool_field(obj, "ignore_merges", false)?,
    })
}

fn parse_normalizer(v: &Value) -> Result<Normalizer, Error> {
    let obj = as_object(v, "normalizer")?;
    match type_of(obj, "normalizer")? {
        "NFC" => Ok(Normalizer { nfc: true }),
        "Sequence" => {
            let items = obj
                .get("normalizers")
                .and_then(Value::as_array)
                .ok_or_else(|| invalid("normalizer Sequence has no \"normalizers\" array"))?;
            let mut out = Normalizer::default();
            for item in items {
                out.nfc |= parse_normalizer(item)?.nfc;
            }
            Ok(out)
        }
        other => Err(refused(format!("normalizer {other}"), NORMALIZERS)),
    }
}

fn parse_pre_tokenizer(v: &Value, out: &mut Vec<PreTokenizer>) -> Result<(), Error> {
    let obj = as_object(v, "pre_tokenizer")?;
    match type_of(obj, "pre_tokenizer")? {
        "Sequence" => {
            let items = obj
                .get("pretokenizers")
                .and_then(Value::as_array)
                .ok_or_else(|| invalid("pre-tokenizer Sequence has no \"pretokenizers\" array"))?;
            for item in items {
                parse_pre_tokenizer(item, out)?;
            }
        }
        "ByteLevel" => out.push(PreTokenizer::ByteLevel {
            add_prefix_space: bool_field(obj, "add_prefix_space", true)?,
            use_regex: bool_field(obj, "use_regex", true)?,
        }),
        "Digits" => out.push(PreTokenizer::Digits {
            individual: bool_field(obj, "individual_digits", false)?,
        }),
        "Split" => {
            let pattern = obj
                .get("pattern")
                .and_then(Value::as_object)
                .ok_or_else(|| invalid("pre-tokenizer Split has no \"pattern\" object"))?;
            let pattern = if let Some(s) = pattern.get("String").and_then(Value::as_str) {
                Pattern::literal(s)?
            } else if let Some(r) = pattern.get("Regex").and_then(Value::as_str) {
                Pattern::regex(r)?
            } else {
                return Err(invalid(
                    "pre-tokenizer Split pattern is neither {\"String\"} nor {\"Regex\"}",
                ));
            };
            let behavior = match obj.get("behavior").and_then(Value::as_str) {
                Some("Removed") => Behavior::Removed,
                Some("Isolated") => Behavior::Isolated,
                Some("MergedWithPrevious") => Behavior::MergedWithPrevious,
                Some("MergedWithNext") => Behavior::MergedWithNext,
                Some("Contiguous") => Behavior::Contiguous,
                other => {
                    return Err(invalid(format!(
                        "pre-tokenizer Split behavior {other:?}, expected Removed, Isolated, \
                         MergedWithPrevious, MergedWithNext or Contiguous"
                    )));
                }
            };
            out.push(PreTokenizer::Split {
                pattern,
                behavior,
                invert: bool_field(obj, "invert", false)?,
            });
        }
        other => return Err(refused(format!("pre-tokenizer {other}"), PRE_TOKENIZERS)),
    }
    Ok(())
}

fn parse_post(v: &Value) -> Result<PostProcessor, Error> {
    let obj = as_object(v, "post_processor")?;
    match type_of(obj, "post_processor")? {
        "ByteLevel" => Ok(PostProcessor::Identity),
        "TemplateProcessing" => {
            let specials = obj
                .get("special_tokens")
                .and_then(Value::as_object)
                .ok_or_else(|| invalid("TemplateProcessing has no \"special_tokens\" object"))?;
            let single = obj
                .get("single")
                .and_then(Value::as_array)
                .ok_or_else(|| invalid("TemplateProcessing has no \"single\" array"))?;
            let mut pieces = Vec::with_capacity(single.len());
            for piece in single {
                let piece = as_object(piece, "a template piece")?;
                if let Some(seq) = piece.get("Sequence") {
                    let id = seq.get("id").and_then(Value::as_str);
                    if id != Some("A") {
                        return Err(invalid(format!(
                            "template sequence {id:?} in \"single\", expected \"A\""
                        )));
                    }
                    pieces.push(TemplatePiece::Sequence);
                } else if let Some(sp) = piece.get("SpecialToken") {
                    let id = sp
                        .get("id")
                        .and_then(Value::as_str)
                        .ok_or_else(|| invalid("template special token has no \"id\""))?;
                    let ids = specials
                        .get(id)
                        .and_then(|s| s.get("ids"))
                        .and_then(Value::as_array)
                        .ok_or_else(|| {
                            invalid(format!(
                                "template special token {id:?} is not in \"special_tokens\""
                            ))
                        })?;
                    let ids = ids
                        .iter()
                        .map(|i| i.as_u64().and_then(|i| u32::try_from(i).ok()))
                        .collect::<Option<Vec<u32>>>()
                        .ok_or_else(|| {
                            invalid(format!(
                                "template special token {id:?} has ids that are not u32"
                            ))
                        })?;
                    pieces.push(TemplatePiece::Special(ids));
                } else {
                    return Err(invalid(
                        "template piece is neither Sequence nor SpecialToken",
                    ));
                }
            }
            Ok(PostProcessor::Template { single: pieces })
        }
        other => Err(refused(format!("post-processor {other}"), POST_PROCESSORS)),
    }
}
