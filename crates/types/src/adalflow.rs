//! The AdalFlow core data classes (seed 004, `adalflow.core.types`).
//!
//! Model types, embedder, generator and retriever outputs, function definitions and
//! calls, the Python-style function expressions an LLM writes (with a parser,
//! [`parse_function_call_expr`]), tool and step outputs, runner results, documents, and
//! dialog turns gathered in a [`Conversation`].
//!
//! Field names are AdalFlow's, so these types read and write the JSON AdalFlow's
//! `to_dict` produces. Where AdalFlow's Python relies on reflection, I/O or async, this
//! module keeps the data and offers a pure counterpart:
//!
//! * [`Function::from_function`] names a Rust `fn` item with [`std::any::type_name`];
//! * [`GeneratorOutput::decode_images`] decodes images in memory instead of saving them;
//! * [`GeneratorOutput::events`] lists the events `stream_events` would yield.
//!
//! ```
//! use agentry_types::adalflow::{parse_function_call_expr, FunctionExpression};
//! use serde_json::json;
//!
//! let function = parse_function_call_expr(r#"search(query="rust", limit=5)"#).unwrap();
//! assert_eq!(function.name, "search");
//! assert_eq!(function.kwargs["query"], json!("rust"));
//! assert_eq!(function.kwargs["limit"], json!(5));
//!
//! // Nested calls are refused with the byte offset where they start.
//! let error = FunctionExpression::new("add(1, mul(2, 3))").to_function().unwrap_err();
//! assert_eq!(error.offset(), 7);
//! ```

use std::collections::BTreeMap;
use std::fmt::Write as _;

use base64::Engine as _;
use base64::alphabet;
use base64::engine::DecodePaddingMode;
use base64::engine::general_purpose::{GeneralPurpose, GeneralPurposeConfig};
use schemars::JsonSchema;
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::{Map, Value};

use crate::message::{DataUri, DataUriError};
use crate::time::Timestamp;
use crate::usage::Usage;

// ---------------------------------------------------------------------------------------
// Helpers shared by the data classes.
// ---------------------------------------------------------------------------------------

/// A new id: a UUIDv7 string (AdalFlow uses `uuid4` strings; any UUID string will do).
fn new_id() -> String {
    uuid::Uuid::now_v7().hyphenated().to_string()
}

fn new_optional_id() -> Option<String> {
    Some(new_id())
}

fn now_optional() -> Option<Timestamp> {
    Some(Timestamp::now())
}

/// Removes the `default` that schemars computes from a field's default function: a
/// fresh id or the current time is no fixed default.
fn drop_default(schema: &mut schemars::Schema) {
    schema.remove("default");
}

/// Reads `null` as the type's default, as AdalFlow's `Optional[...] = <factory>` fields allow.
fn null_as_default<'de, D, T>(deserializer: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Default + Deserialize<'de>,
{
    Ok(Option::<T>::deserialize(deserializer)?.unwrap_or_default())
}

/// Serializes with a four-space indent, as AdalFlow's `to_json` (`json.dumps(indent=4)`).
fn to_pretty_json<T: Serialize + ?Sized>(value: &T) -> String {
    let mut buf = Vec::new();
    let formatter = serde_json::ser::PrettyFormatter::with_indent(b"    ");
    let mut serializer = serde_json::Serializer::with_formatter(&mut buf, formatter);
    // Serializing plain data with string keys into memory cannot fail.
    if value.serialize(&mut serializer).is_err() {
        return String::new();
    }
    String::from_utf8(buf).unwrap_or_default()
}

// ---------------------------------------------------------------------------------------
// Model types.
// ---------------------------------------------------------------------------------------

/// The type of a model; it tells a model client how to call the model.
///
/// Serializes as AdalFlow's member name (`"EMBEDDER"`, `"LLM"`, `"LLM_REASONING"`, …);
/// [`ModelType::value`] is the Python enum's integer value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum ModelType {
    /// An embedding model.
    Embedder,
    /// A chat or completion model.
    Llm,
    /// A reasoning model compatible with OpenAI's Responses API.
    LlmReasoning,
    /// A ranking model.
    Reranker,
    /// An image generation model, such as DALL-E.
    ImageGeneration,
    /// Not known.
    Undefined,
}

impl ModelType {
    /// Every model type, in AdalFlow's order.
    pub const ALL: [Self; 6] = [
        Self::Embedder,
        Self::Llm,
        Self::LlmReasoning,
        Self::Reranker,
        Self::ImageGeneration,
        Self::Undefined,
    ];

    /// AdalFlow's integer value: 1 for `EMBEDDER` up to 6 for `UNDEFINED`.
    #[must_use]
    pub const fn value(self) -> u8 {
        match self {
            Self::Embedder => 1,
            Self::Llm => 2,
            Self::LlmReasoning => 3,
            Self::Reranker => 4,
            Self::ImageGeneration => 5,
            Self::Undefined => 6,
        }
    }

    /// The model type with AdalFlow's integer value, if there is one.
    #[must_use]
    pub const fn from_value(value: u8) -> Option<Self> {
        match value {
            1 => Some(Self::Embedder),
            2 => Some(Self::Llm),
            3 => Some(Self::LlmReasoning),
            4 => Some(Self::Reranker),
            5 => Some(Self::ImageGeneration),
            6 => Some(Self::Undefined),
            _ => None,
        }
    }

    /// AdalFlow's member name, such as `LLM_REASONING`.
    #[must_use]
    pub const fn name(self) -> &'static str {
        match self {
            Self::Embedder => "EMBEDDER",
            Self::Llm => "LLM",
            Self::LlmReasoning => "LLM_REASONING",
            Self::Reranker => "RERANKER",
            Self::ImageGeneration => "IMAGE_GENERATION",
            Self::Undefined => "UNDEFINED",
        }
    }

    /// The keys `model_kwargs` must hold for this model type; see [`get_model_args`].
    #[must_use]
    pub const fn model_args(self) -> &'static [&'static str] {
        get_model_args(self)
    }
}

/// The keys `model_kwargs` must hold for a model type: `["model"]` for embedders and
/// LLMs (reasoning ones included), `["model", "top_k", "documents", "query"]` for
/// rerankers, none for the others.
#[must_use]
pub const fn get_model_args(model_type: ModelType) -> &'static [&'static str] {
    match model_type {
        ModelType::Embedder | ModelType::Llm | ModelType::LlmReasoning => &["model"],
        ModelType::Reranker => &["model", "top_k", "documents", "query"],
        ModelType::ImageGeneration | ModelType::Undefined => &[],
    }
}

// ---------------------------------------------------------------------------------------
// Embedder.
// ---------------------------------------------------------------------------------------

/// How far an embedding's L2 norm may be from 1 and still count as normalized
/// (AdalFlow's `is_normalized` uses `abs(norm - 1) < 1e-4`).
pub const NORMALIZATION_TOLERANCE: f64 = 1e-4;

/// One embedding vector, as in OpenAI's `embedding` object.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Embedding {
    /// The vector.
    pub embedding: Vec<f32>,
    /// The position of the input it embeds, in case some are missing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub index: Option<usize>,
}

impl Embedding {
    /// An embedding of the input at `index`.
    #[must_use]
    pub fn new(embedding: Vec<f32>, index: Option<usize>) -> Self {
        Self { embedding, index }
    }

    /// The number of components.
    #[must_use]
    pub fn dim(&self) -> usize {
        self.embedding.len()
    }

    /// The L2 norm, computed in `f64`.
    #[must_use]
    pub fn l2_norm(&self) -> f64 {
        self.embedding.iter().map(|x| f64::from(*x) * f64::from(*x)).sum::<f64>().sqrt()
    }

    /// Whether the vector is non-empty and its L2 norm is within
    /// [`NORMALIZATION_TOLERANCE`] of 1.
    #[must_use]
    pub fn is_normalized(&self) -> bool {
        !self.embedding.is_empty() && (self.l2_norm() - 1.0).abs() < NORMALIZATION_TOLERANCE
    }
}

/// Token usage of an embedding call, as in OpenAI's embedding response (AdalFlow `Usage`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct EmbeddingUsage {
    /// Tokens in the input.
    pub prompt_tokens: u64,
    /// Tokens billed in all.
    pub total_tokens: u64,
}

impl From<EmbeddingUsage> for Usage {
    /// Embedding calls only read: the prompt tokens are the input, nothing is output.
    fn from(usage: EmbeddingUsage) -> Self {
        Self::new(usage.prompt_tokens, 0)
    }
}

/// Why the embeddings of an [`EmbedderOutput`] are inconsistent.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum EmbeddingError {
    /// An embedding's dimension differs from the first one's.
    #[error("embedding {index} has {found} dimensions, but embedding 0 has {expected}")]
    DimensionMismatch {
        /// Position of the offending embedding in `data`.
        index: usize,
        /// The first embedding's dimension.
        expected: usize,
        /// The offending embedding's dimension.
        found: usize,
    },
    /// An embedding holds NaN or an infinity.
    #[error("embedding {index} holds a non-finite value at position {position}")]
    NonFinite {
        /// Position of the offending embedding in `data`.
        index: usize,
        /// Position of the value in the vector.
        position: usize,
    },
}

/// The output of an embedder for one batch of input.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct EmbedderOutput {
    /// One embedding per input.
    #[serde(default, deserialize_with = "null_as_default")]
    pub data: Vec<Embedding>,
    /// The model name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// Token usage.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<EmbeddingUsage>,
    /// The error, when the call failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The provider's raw response, kept when the call failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub raw_response: Option<Value>,
    /// The input texts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input: Option<Vec<String>>,
}

/// AdalFlow's alias of [`EmbedderOutput`].
pub type EmbedderOutputType = EmbedderOutput;

impl EmbedderOutput {
    /// Output holding these embeddings.
    #[must_use]
    pub fn new(data: Vec<Embedding>) -> Self {
        Self { data, ..Self::default() }
    }

    /// The number of embeddings.
    #[must_use]
    pub fn length(&self) -> usize {
        self.data.len()
    }

    /// The dimension of the first embedding, assumed to be every embedding's; `None`
    /// when there is no embedding or the first is empty (where AdalFlow returns -1).
    /// [`EmbedderOutput::validate`] checks the assumption.
    #[must_use]
    pub fn embedding_dim(&self) -> Option<usize> {
        self.data.first().map(Embedding::dim).filter(|dim| *dim > 0)
    }

    /// Whether there is at least one embedding and every embedding is a unit vector,
    /// within [`NORMALIZATION_TOLERANCE`]. (AdalFlow looks at the first one only.)
    #[must_use]
    pub fn is_normalized(&self) -> bool {
        !self.data.is_empty() && self.data.iter().all(Embedding::is_normalized)
    }

    /// Checks that every embedding has the first one's dimension and only finite values;
    /// returns that dimension (`None` when there is no embedding).
    pub fn validate(&self) -> Result<Option<usize>, EmbeddingError> {
        let mut expected = None;
        for (index, embedding) in self.data.iter().enumerate() {
            let found = embedding.dim();
            match expected {
                None => expected = Some(found),
                Some(expected) if expected != found => {
                    return Err(EmbeddingError::DimensionMismatch { index, expected, found });
                }
                Some(_) => {}
            }
            if let Some(position) = embedding.embedding.iter().position(|x| !x.is_finite()) {
                return Err(EmbeddingError::NonFinite { index, position });
            }
        }
        Ok(expected)
    }
}

// ---------------------------------------------------------------------------------------
// Generator usage.
// ---------------------------------------------------------------------------------------

/// A token and its log probability, like OpenAI's `ChatCompletionTokenLogprob`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct TokenLogProb {
    /// The token.
    pub token: String,
    /// Its log probability.
    pub logprob: f64,
}

impl TokenLogProb {
    /// A token with its log probability.
    #[must_use]
    pub fn new(token: impl Into<String>, logprob: f64) -> Self {
        Self { token: token.into(), logprob }
    }

    /// The probability, `exp(logprob)`.
    #[must_use]
    pub fn probability(&self) -> f64 {
        self.logprob.exp()
    }
}

/// Token usage of a completion, as in OpenAI's `completion_usage`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct CompletionUsage {
    /// Tokens generated.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completion_tokens: Option<u64>,
    /// Tokens in the prompt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_tokens: Option<u64>,
    /// Prompt plus completion tokens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub total_tokens: Option<u64>,
}

impl CompletionUsage {
    /// Usage with all three counts; the total is the sum.
    #[must_use]
    pub const fn new(prompt_tokens: u64, completion_tokens: u64) -> Self {
        Self {
            completion_tokens: Some(completion_tokens),
            prompt_tokens: Some(prompt_tokens),
            total_tokens: Some(prompt_tokens.saturating_add(completion_tokens)),
        }
    }
}

impl From<CompletionUsage> for Usage {
    /// Missing counts become zero.
    fn from(usage: CompletionUsage) -> Self {
        Self::new(usage.prompt_tokens.unwrap_or(0), usage.completion_tokens.unwrap_or(0))
    }
}

impl From<Usage> for CompletionUsage {
    /// Cache and reasoning details have no place here and are dropped.
    fn from(usage: Usage) -> Self {
        Self::new(usage.input_tokens, usage.output_tokens)
    }
}

/// Details of a response's input tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(default)]
pub struct InputTokensDetails {
    /// Input tokens read from the cache; AdalFlow's default is 0.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cached_tokens: Option<u64>,
}

impl Default for InputTokensDetails {
    fn default() -> Self {
        Self { cached_tokens: Some(0) }
    }
}

/// Details of a response's output tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(default)]
pub struct OutputTokensDetails {
    /// Output tokens spent on reasoning; AdalFlow's default is 0.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning_tokens: Option<u64>,
}

impl Default for OutputTokensDetails {
    fn default() -> Self {
        Self { reasoning_tokens: Some(0) }
    }
}

/// Token usage of a response, as in OpenAI's `response_usage`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ResponseUsage {
    /// Input tokens, cached ones included.
    pub input_tokens: u64,
    /// Output tokens, reasoning included.
    pub output_tokens: u64,
    /// Input plus output tokens.
    pub total_tokens: u64,
    /// Details of the input tokens.
    #[serde(default)]
    pub input_tokens_details: InputTokensDetails,
    /// Details of the output tokens.
    #[serde(default)]
    pub output_tokens_details: OutputTokensDetails,
}

impl ResponseUsage {
    /// Usage with default details; the total is the sum.
    #[must_use]
    pub fn new(input_tokens: u64, output_tokens: u64) -> Self {
        Self {
            input_tokens,
            output_tokens,
            total_tokens: input_tokens.saturating_add(output_tokens),
            input_tokens_details: InputTokensDetails::default(),
            output_tokens_details: OutputTokensDetails::default(),
        }
    }
}

impl From<ResponseUsage> for Usage {
    /// Cached tokens become cache-read tokens; reasoning tokens carry over.
    fn from(usage: ResponseUsage) -> Self {
        Self {
            cache_read_tokens: usage.input_tokens_details.cached_tokens,
            reasoning_tokens: usage.output_tokens_details.reasoning_tokens,
            ..Self::new(usage.input_tokens, usage.output_tokens)
        }
    }
}

impl From<Usage> for ResponseUsage {
    /// Cache-read and reasoning tokens fill the details as they are (unknown stays
    /// unknown), so converting back gives the same [`Usage`] minus cache writes and the
    /// input breakdown.
    fn from(usage: Usage) -> Self {
        Self {
            input_tokens: usage.input_tokens,
            output_tokens: usage.output_tokens,
            total_tokens: usage.total_tokens(),
            input_tokens_details: InputTokensDetails { cached_tokens: usage.cache_read_tokens },
            output_tokens_details: OutputTokensDetails { reasoning_tokens: usage.reasoning_tokens },
        }
    }
}

// ---------------------------------------------------------------------------------------
// Retriever.
// ---------------------------------------------------------------------------------------

/// The output of a retriever for one query: which documents matched, how well, and
/// optionally the query and the documents themselves.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(bound(deserialize = "Q: Deserialize<'de>, D: Deserialize<'de>"))]
pub struct RetrieverOutput<Q = String, D = Document> {
    /// The output's id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// Indices of the retrieved documents, best first.
    pub doc_indices: Vec<usize>,
    /// Their scores, in the same order.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub doc_scores: Option<Vec<f64>>,
    /// The query.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub query: Option<Q>,
    /// The retrieved documents, in the same order.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub documents: Option<Vec<D>>,
}

impl<Q, D> RetrieverOutput<Q, D> {
    /// Output holding document indices only.
    #[must_use]
    pub fn new(doc_indices: Vec<usize>) -> Self {
        Self { id: None, doc_indices, doc_scores: None, query: None, documents: None }
    }

    /// The same output with scores.
    #[must_use]
    pub fn with_scores(mut self, doc_scores: Vec<f64>) -> Self {
        self.doc_scores = Some(doc_scores);
        self
    }

    /// The same output with its query.
    #[must_use]
    pub fn with_query(mut self, query: Q) -> Self {
        self.query = Some(query);
        self
    }

    /// The same output with the retrieved documents.
    #[must_use]
    pub fn with_documents(mut self, documents: Vec<D>) -> Self {
        self.documents = Some(documents);
        self
    }
}

// ---------------------------------------------------------------------------------------
// Function definitions and calls.
// ---------------------------------------------------------------------------------------

/// The text format of [`FunctionDefinition::fn_schema_str`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum SchemaFormat {
    /// JSON indented by four spaces.
    #[default]
    Json,
    /// Block-style YAML.
    Yaml,
}

/// A function (tool) definition: its name, description and JSON Schema of parameters.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct FunctionDefinition {
    /// The tool's name.
    pub func_name: String,
    /// What the tool does.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub func_desc: Option<String>,
    /// The JSON Schema of the parameters (`{"type": "object", "properties": …}`).
    #[serde(default, deserialize_with = "null_as_default")]
    pub func_parameters: Map<String, Value>,
}

impl FunctionDefinition {
    /// A definition without parameters.
    #[must_use]
    pub fn new(func_name: impl Into<String>, func_desc: Option<&str>) -> Self {
        Self {
            func_name: func_name.into(),
            func_desc: func_desc.map(str::to_owned),
            func_parameters: Map::new(),
        }
    }

    /// The same definition with this parameter schema.
    #[must_use]
    pub fn with_parameters(mut self, func_parameters: Map<String, Value>) -> Self {
        self.func_parameters = func_parameters;
        self
    }

    /// A definition whose parameters are the JSON Schema of `T` (its `$schema` and
    /// `title` removed). Without `func_desc`, the description is `T`'s doc comment.
    #[must_use]
    pub fn from_schema<T: JsonSchema>(func_name: impl Into<String>, func_desc: Option<&str>) -> Self {
        let mut parameters = match schemars::schema_for!(T).to_value() {
            Value::Object(map) => map,
            _ => Map::new(),
        };
        parameters.remove("$schema");
        parameters.remove("title");
        let description = func_desc
            .map(str::to_owned)
            .or_else(|| parameters.get("description").and_then(Value::as_str).map(str::to_owned));
        Self { func_name: func_name.into(), func_desc: description, func_parameters: parameters }
    }

    /// The definition as text for a prompt: JSON with a four-space indent, or YAML.
    /// Fields come in declaration order (`func_name`, `func_desc`, `func_parameters`).
    #[must_use]
    pub fn fn_schema_str(&self, format: SchemaFormat) -> String {
        match format {
            SchemaFormat::Json => to_pretty_json(self),
            SchemaFormat::Yaml => {
                let mut out = String::new();
                yaml_entry(&mut out, "func_name", &Value::String(self.func_name.clone()), 0);
                if let Some(desc) = &self.func_desc {
                    yaml_entry(&mut out, "func_desc", &Value::String(desc.clone()), 0);
                }
                yaml_entry(&mut out, "func_parameters", &Value::Object(self.func_parameters.clone()), 0);
                out
            }
        }
    }
}

/// Renders a JSON value as block-style YAML, ending with a newline.
///
/// Maps become `key: value` lines (nested maps indented by two spaces), sequences
/// become `- item` lines (under a key, at the key's indentation, as PyYAML writes
/// them), empty containers `{}` and `[]`. A string is written plain when that cannot be
/// misread (it starts with a letter or `_`, holds only letters, digits, spaces and
/// `_-./()`, and is no YAML 1.1 boolean or null word); otherwise it is double-quoted
/// with JSON escapes, which YAML reads identically.
#[must_use]
pub fn to_yaml_string(value: &Value) -> String {
    let mut out = String::new();
    yaml_node(&mut out, value, 0, false);
    out
}

fn push_indent(out: &mut String, indent: usize) {
    out.extend(std::iter::repeat_n(' ', indent));
}

fn is_nonempty_container(value: &Value) -> bool {
    match value {
        Value::Object(map) => !map.is_empty(),
        Value::Array(items) => !items.is_empty(),
        _ => false,
    }
}

/// Writes `key: value` at `indent`.
fn yaml_entry(out: &mut String, key: &str, value: &Value, indent: usize) {
    push_indent(out, indent);
    yaml_entry_inline(out, key, value, indent);
}

/// Writes `key: value` whose first line's indentation is already written.
fn yaml_entry_inline(out: &mut String, key: &str, value: &Value, indent: usize) {
    out.push_str(&yaml_string(key));
    out.push(':');
    match value {
        Value::Object(map) if !map.is_empty() => {
            out.push('\n');
            yaml_node(out, value, indent + 2, false);
        }
        Value::Array(items) if !items.is_empty() => {
            out.push('\n');
            yaml_node(out, value, indent, false);
        }
        _ => {
            out.push(' ');
            out.push_str(&yaml_scalar(value));
            out.push('\n');
        }
    }
}

/// Writes a node at `indent`; when `inline`, its first line's indentation (a `- `) is
/// already written.
fn yaml_node(out: &mut String, value: &Value, indent: usize, inline: bool) {
    match value {
        Value::Object(map) if !map.is_empty() => {
            for (i, (key, item)) in map.iter().enumerate() {
                if !(inline && i == 0) {
                    push_indent(out, indent);
                }
                yaml_entry_inline(out, key, item, indent);
            }
        }
        Value::Array(items) if !items.is_empty() => {
            for (i, item) in items.iter().enumerate() {
                if !(inline && i == 0) {
                    push_indent(out, indent);
                }
                out.push_str("- ");
                if is_nonempty_container(item) {
                    yaml_node(out, item, indent + 2, true);
                } else {
                    out.push_str(&yaml_scalar(item));
                    out.push('\n');
                }
            }
        }
        _ => {
            out.push_str(&yaml_scalar(value));
            out.push('\n');
        }
    }
}

fn yaml_scalar(value: &Value) -> String {
    match value {
        Value::Null => "null".to_owned(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => n.to_string(),
        Value::String(s) => yaml_string(s),
        Value::Array(_) => "[]".to_owned(),
        Value::Object(_) => "{}".to_owned(),
    }
}

fn yaml_string(s: &str) -> String {
    const RESERVED: [&str; 11] = ["y", "n", "yes", "no", "true", "false", "on", "off", "null", "~", "nan"];
    let plain = s.chars().next().is_some_and(|c| c.is_alphabetic() || c == '_')
        && !s.ends_with(' ')
        && s.chars().all(|c| c.is_alphanumeric() || " _-./()".contains(c))
        && !RESERVED.iter().any(|word| s.eq_ignore_ascii_case(word));
    if plain { s.to_owned() } else { Value::String(s.to_owned()).to_string() }
}

/// Python keywords: they can be neither function names nor keyword-argument names.
const PYTHON_KEYWORDS: [&str; 35] = [
    "False", "None", "True", "and", "as", "assert", "async", "await", "break", "class", "continue", "def",
    "del", "elif", "else", "except", "finally", "for", "from", "global", "if", "import", "in", "is",
    "lambda", "nonlocal", "not", "or", "pass", "raise", "return", "try", "while", "with", "yield",
];

fn is_python_keyword(word: &str) -> bool {
    PYTHON_KEYWORDS.contains(&word)
}

fn is_ident_start(c: char) -> bool {
    c == '_' || c.is_alphabetic()
}

fn is_ident_continue(c: char) -> bool {
    c == '_' || c.is_alphanumeric()
}

fn is_identifier(s: &str) -> bool {
    let mut chars = s.chars();
    chars.next().is_some_and(is_ident_start) && chars.all(is_ident_continue)
}

/// Whether `name` can be written as a Python name: identifiers joined by dots, none of
/// them a keyword.
fn is_callable_name(name: &str) -> bool {
    name.split('.').all(|part| is_identifier(part) && !is_python_keyword(part))
}

/// Why a Rust callable could not be turned into a [`Function`] or a
/// [`FunctionExpression`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum FromFunctionError {
    /// A closure has no name to call it by.
    #[error("closures have no name: {type_name}")]
    Closure {
        /// The closure's type name.
        type_name: &'static str,
    },
    /// The value is not a `fn` item (a function pointer, a boxed closure, a plain value…).
    #[error("{type_name} is not a fn item")]
    NotAFunctionItem {
        /// The value's type name.
        type_name: &'static str,
    },
    /// The function name cannot be written in a Python call expression.
    #[error("{name:?} is not a valid function name")]
    InvalidName {
        /// The rejected name.
        name: String,
    },
    /// A keyword-argument name is not a Python identifier, or is a Python keyword.
    #[error("{name:?} is not a valid keyword-argument name")]
    InvalidKeyword {
        /// The rejected name.
        name: String,
    },
}

/// The name of a Rust `fn` item (a function or a method, not a closure or a pointer):
/// the last path segment of [`std::any::type_name`], generic arguments removed.
///
/// `fn` items are zero-sized, so values of other sizes (function pointers, numbers…)
/// are refused; a zero-sized unit struct would pass as its own name.
pub fn function_name<F>(_func: &F) -> Result<&'static str, FromFunctionError> {
    let type_name = std::any::type_name::<F>();
    if type_name.contains("{{closure}}") || type_name.contains("{closure#") {
        return Err(FromFunctionError::Closure { type_name });
    }
    if std::mem::size_of::<F>() != 0 {
        return Err(FromFunctionError::NotAFunctionItem { type_name });
    }
    let path = strip_generic_arguments(type_name);
    let name = path.rsplit("::").next().unwrap_or(path);
    if is_identifier(name) { Ok(name) } else { Err(FromFunctionError::NotAFunctionItem { type_name }) }
}

/// `a::b::f<T, U<V>>` → `a::b::f`.
fn strip_generic_arguments(path: &str) -> &str {
    if !path.ends_with('>') {
        return path;
    }
    let mut depth = 0usize;
    for (i, c) in path.char_indices().rev() {
        match c {
            '>' => depth += 1,
            '<' => {
                depth = depth.saturating_sub(1);
                if depth == 0 {
                    return path.get(..i).unwrap_or(path);
                }
            }
            _ => {}
        }
    }
    path
}

/// A function call: a name with positional and keyword arguments.
///
/// Serialized as AdalFlow's `Function`, including the runner's private
/// `_is_answer_final` and `_answer` fields when they are set.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Function {
    /// The call's id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// Why the function is called.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub thought: Option<String>,
    /// The function's name.
    #[serde(default)]
    pub name: String,
    /// Positional arguments.
    #[serde(default, deserialize_with = "null_as_default")]
    pub args: Vec<Value>,
    /// Keyword arguments.
    #[serde(default, deserialize_with = "null_as_default")]
    pub kwargs: Map<String, Value>,
    /// Whether this call carries the final answer.
    #[serde(rename = "_is_answer_final", default, skip_serializing_if = "Option::is_none")]
    pub is_answer_final: Option<bool>,
    /// The final answer, when this call carries it.
    #[serde(rename = "_answer", default, skip_serializing_if = "Option::is_none")]
    pub answer: Option<Value>,
}

impl Function {
    /// A call of `name` without arguments.
    #[must_use]
    pub fn new(name: impl Into<String>) -> Self {
        Self { name: name.into(), ..Self::default() }
    }

    /// A call of the Rust `fn` item `func` (named by [`function_name`]), AdalFlow's
    /// `Function.from_function(func, thought, *args, **kwargs)`.
    ///
    /// ```
    /// use agentry_types::adalflow::Function;
    /// use serde_json::json;
    ///
    /// fn add(a: i64, b: i64) -> i64 { a + b }
    ///
    /// let call = Function::from_function(&add, Some("Add two numbers"), vec![json!(1), json!(2)], Default::default())
    ///     .unwrap();
    /// assert_eq!(call.name, "add");
    /// assert!(Function::from_function(&|a: i64| a, None, vec![], Default::default()).is_err());
    /// ```
    pub fn from_function<F>(
        func: &F,
        thought: Option<&str>,
        args: Vec<Value>,
        kwargs: Map<String, Value>,
    ) -> Result<Self, FromFunctionError> {
        let name = function_name(func)?;
        Ok(Self {
            thought: thought.map(str::to_owned),
            name: name.to_owned(),
            args,
            kwargs,
            ..Self::default()
        })
    }

    /// Parses a Python call expression such as `add(1, b=2)`; see
    /// [`parse_function_call_expr`].
    pub fn parse_expression(action: &str) -> Result<Self, ParseActionError> {
        parse_function_call_expr(action)
    }

    /// The same call with this id.
    #[must_use]
    pub fn with_id(mut self, id: impl Into<String>) -> Self {
        self.id = Some(id.into());
        self
    }

    /// The same call with this thought.
    #[must_use]
    pub fn with_thought(mut self, thought: impl Into<String>) -> Self {
        self.thought = Some(thought.into());
        self
    }

    /// The same call with these positional arguments.
    #[must_use]
    pub fn with_args(mut self, args: Vec<Value>) -> Self {
        self.args = args;
        self
    }

    /// The same call with these keyword arguments.
    #[must_use]
    pub fn with_kwargs(mut self, kwargs: Map<String, Value>) -> Self {
        self.kwargs = kwargs;
        self
    }

    /// The call written as a Python expression (`name(1, 'x', k=True)`), with the same
    /// thought; it parses back to this call's name, arguments and thought.
    pub fn to_function_expression(&self) -> Result<FunctionExpression, FromFunctionError> {
        Ok(FunctionExpression {
            thought: self.thought.clone(),
            action: format_call(&self.name, &self.args, &self.kwargs)?,
        })
    }
}

/// Writes `name(args…, key=value…)` with Python literals.
fn format_call(name: &str, args: &[Value], kwargs: &Map<String, Value>) -> Result<String, FromFunctionError> {
    if !is_callable_name(name) {
        return Err(FromFunctionError::InvalidName { name: name.to_owned() });
    }
    let mut out = String::with_capacity(name.len() + 2);
    out.push_str(name);
    out.push('(');
    let mut first = true;
    for arg in args {
        if !first {
            out.push_str(", ");
        }
        first = false;
        write_python_literal(&mut out, arg);
    }
    for (key, value) in kwargs {
        if !is_identifier(key) || is_python_keyword(key) {
            return Err(FromFunctionError::InvalidKeyword { name: key.clone() });
        }
        if !first {
            out.push_str(", ");
        }
        first = false;
        out.push_str(key);
        out.push('=');
        write_python_literal(&mut out, value);
    }
    out.push(')');
    Ok(out)
}

/// A JSON value as a Python literal, as Python's `repr` writes it: `None`, `True`,
/// `False`, numbers, quoted strings (single quotes unless the text holds only single
/// ones), `[…]` lists and `{'key': value}` dicts. [`parse_function_call_expr`] reads it
/// back to the same value.
#[must_use]
pub fn to_python_literal(value: &Value) -> String {
    let mut out = String::new();
    write_python_literal(&mut out, value);
    out
}

fn write_python_literal(out: &mut String, value: &Value) {
    match value {
        Value::Null => out.push_str("None"),
        Value::Bool(true) => out.push_str("True"),
        Value::Bool(false) => out.push_str("False"),
        // Floats always carry a `.` or an exponent, so they read back as floats.
        Value::Number(n) => {
            let _ = write!(out, "{n}");
        }
        Value::String(s) => write_python_string(out, s),
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                write_python_literal(out, item);
            }
            out.push(']');
        }
        Value::Object(map) => {
            out.push('{');
            for (i, (key, item)) in map.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                write_python_string(out, key);
                out.push_str(": ");
                write_python_literal(out, item);
            }
            out.push('}');
        }
    }
}

fn write_python_string(out: &mut String, s: &str) {
    let quote = if s.contains('\'') && !s.contains('"') { '"' } else { '\'' };
    out.push(quote);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c == quote => {
                out.push('\\');
                out.push(c);
            }
            c if c.is_control() => {
                let code = u32::from(c);
                let _ =
                    if code < 0x100 { write!(out, "\\x{code:02x}") } else { write!(out, "\\u{code:04x}") };
            }
            c => out.push(c),
        }
    }
    out.push(quote);
}

/// A function call written as a Python expression, such as `add(a=1, b=2)`, with the
/// reasoning behind it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct FunctionExpression {
    /// Why the function is called.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub thought: Option<String>,
    /// The call expression.
    pub action: String,
}

impl FunctionExpression {
    /// An expression without a thought.
    #[must_use]
    pub fn new(action: impl Into<String>) -> Self {
        Self { thought: None, action: action.into() }
    }

    /// The same expression with this thought.
    #[must_use]
    pub fn with_thought(mut self, thought: impl Into<String>) -> Self {
        self.thought = Some(thought.into());
        self
    }

    /// The expression calling the Rust `fn` item `func` (named by [`function_name`])
    /// with these arguments, AdalFlow's `FunctionExpression.from_function`: positional
    /// arguments first, then `key=value` ones, all as Python literals.
    ///
    /// ```
    /// use agentry_types::adalflow::FunctionExpression;
    /// use serde_json::json;
    ///
    /// fn add(a: i64, b: i64) -> i64 { a + b }
    ///
    /// let kwargs = json!({"a": 1, "b": 2}).as_object().cloned().unwrap();
    /// let expression = FunctionExpression::from_function(&add, Some("Add two numbers"), vec![], kwargs).unwrap();
    /// assert_eq!(expression.action, "add(a=1, b=2)");
    /// ```
    pub fn from_function<F>(
        func: &F,
        thought: Option<&str>,
        args: Vec<Value>,
        kwargs: Map<String, Value>,
    ) -> Result<Self, FromFunctionError> {
        let name = function_name(func)?;
        Ok(Self { thought: thought.map(str::to_owned), action: format_call(name, &args, &kwargs)? })
    }

    /// Parses the action into a [`Function`] carrying this expression's thought.
    pub fn to_function(&self) -> Result<Function, ParseActionError> {
        let mut function = parse_function_call_expr(&self.action)?;
        function.thought.clone_from(&self.thought);
        Ok(function)
    }
}

// ---------------------------------------------------------------------------------------
// The function-expression parser.
// ---------------------------------------------------------------------------------------

/// How deeply lists, tuples and dicts may nest in an action.
pub const MAX_LITERAL_DEPTH: usize = 64;

/// Why an action is not a call expression this module can read. Every variant carries
/// the byte offset in the action where the problem is ([`ParseActionError::offset`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ParseActionError {
    /// The action is empty or blank.
    #[error("the action is empty (byte {offset})")]
    Empty {
        /// Where the input ends.
        offset: usize,
    },
    /// The action ends too early.
    #[error("unexpected end of the action at byte {offset}: expected {expected}")]
    UnexpectedEnd {
        /// Where the input ends.
        offset: usize,
        /// What was expected.
        expected: &'static str,
    },
    /// A character that does not fit here.
    #[error("unexpected {found:?} at byte {offset}: expected {expected}")]
    UnexpectedChar {
        /// Where the character is.
        offset: usize,
        /// The character.
        found: char,
        /// What was expected.
        expected: &'static str,
    },
    /// A string literal without its closing quote.
    #[error("unterminated string literal starting at byte {offset}")]
    UnterminatedString {
        /// Where the literal starts.
        offset: usize,
    },
    /// A malformed (`\x4`) or unsupported (`\N{…}`, a lone surrogate) escape sequence.
    #[error("invalid escape sequence at byte {offset}")]
    InvalidEscape {
        /// Where the backslash is.
        offset: usize,
    },
    /// A malformed number (`1e`, `007`, `0x1f`, `1_000`).
    #[error("invalid number {text:?} at byte {offset}")]
    InvalidNumber {
        /// Where the number starts.
        offset: usize,
        /// The text read.
        text: String,
    },
    /// An integer beyond 64 bits, or a float beyond `f64`'s range.
    #[error("number {text:?} at byte {offset} is out of range")]
    NumberOutOfRange {
        /// Where the number starts.
        offset: usize,
        /// The number.
        text: String,
    },
    /// A Python keyword used as a function or keyword-argument name.
    #[error("{word:?} at byte {offset} is a Python keyword, not a name")]
    ReservedWord {
        /// Where the word starts.
        offset: usize,
        /// The word.
        word: String,
    },
    /// A call inside the arguments; only literals are supported.
    #[error("nested call of {name:?} at byte {offset}: arguments must be literals")]
    NestedCall {
        /// Where the nested call starts.
        offset: usize,
        /// The called name.
        name: String,
    },
    /// A variable name as an argument; only literals are supported.
    #[error("name {name:?} at byte {offset} is not a literal")]
    UnknownName {
        /// Where the name starts.
        offset: usize,
        /// The name.
        name: String,
    },
    /// A positional argument after a keyword argument.
    #[error("positional argument at byte {offset} follows a keyword argument")]
    PositionalAfterKeyword {
        /// Where the positional argument starts.
        offset: usize,
    },
    /// The same keyword argument twice.
    #[error("keyword argument {name:?} at byte {offset} is repeated")]
    DuplicateKeyword {
        /// Where the repetition starts.
        offset: usize,
        /// The keyword.
        name: String,
    },
    /// A dict key that is not a string; JSON objects only have string keys.
    #[error("dict key at byte {offset} is not a string")]
    NonStringKey {
        /// Where the key starts.
        offset: usize,
    },
    /// A set literal (`{1, 2}`); JSON has no sets.
    #[error("set literal at byte {offset} is not supported")]
    SetNotSupported {
        /// Where the set starts.
        offset: usize,
    },
    /// Something after the closing parenthesis of the call.
    #[error("unexpected input after the call at byte {offset}")]
    TrailingInput {
        /// Where it starts.
        offset: usize,
    },
    /// Lists, tuples and dicts nested deeper than [`MAX_LITERAL_DEPTH`].
    #[error("literals nest deeper than {limit} levels at byte {offset}")]
    TooDeep {
        /// Where the limit is crossed.
        offset: usize,
        /// The limit.
        limit: usize,
    },
}

impl ParseActionError {
    /// The byte offset in the action where the problem is.
    #[must_use]
    pub const fn offset(&self) -> usize {
        match self {
            Self::Empty { offset }
            | Self::UnexpectedEnd { offset, .. }
            | Self::UnexpectedChar { offset, .. }
            | Self::UnterminatedString { offset }
            | Self::InvalidEscape { offset }
            | Self::InvalidNumber { offset, .. }
            | Self::NumberOutOfRange { offset, .. }
            | Self::ReservedWord { offset, .. }
            | Self::NestedCall { offset, .. }
            | Self::UnknownName { offset, .. }
            | Self::PositionalAfterKeyword { offset }
            | Self::DuplicateKeyword { offset, .. }
            | Self::NonStringKey { offset }
            | Self::SetNotSupported { offset }
            | Self::TrailingInput { offset }
            | Self::TooDeep { offset, .. } => *offset,
        }
    }
}

/// Parses a Python call expression into a [`Function`] (AdalFlow's
/// `parse_function_call_expr`, without evaluation).
///
/// The callee is a name, dotted names allowed (`ns.tool`). The arguments are
/// positional ones, then `key=value` ones, each a literal: integers (64-bit), floats
/// (`1.5`, `.5`, `1e-3`), with an optional sign; strings in single, double or triple
/// quotes, `r`-prefixed raw strings, with Python's escapes; `True`, `False`, `None`;
/// lists and tuples (both become JSON arrays, `(x)` is just `x`); dicts with string
/// keys. Trailing commas and whitespace, newlines included, are allowed.
///
/// Everything else is refused with a [`ParseActionError`] giving the byte offset:
/// nested calls, variables, arithmetic, sets, `*args`, and any malformed input. The
/// parser never panics and limits nesting to [`MAX_LITERAL_DEPTH`].
///
/// ```
/// use agentry_types::adalflow::parse_function_call_expr;
/// use serde_json::json;
///
/// let call = parse_function_call_expr(r#"ns.tool([1, 2], {"k": True}, flag=None)"#).unwrap();
/// assert_eq!(call.name, "ns.tool");
/// assert_eq!(call.args, vec![json!([1, 2]), json!({"k": true})]);
/// assert_eq!(call.kwargs["flag"], json!(null));
/// ```
pub fn parse_function_call_expr(action: &str) -> Result<Function, ParseActionError> {
    Parser { src: action, pos: 0, depth: 0 }.parse_call()
}

struct Parser<'a> {
    src: &'a str,
    pos: usize,
    depth: usize,
}

impl Parser<'_> {
    fn rest(&self) -> &str {
        self.src.get(self.pos..).unwrap_or("")
    }

    fn peek(&self) -> Option<char> {
        self.rest().chars().next()
    }

    fn peek_second(&self) -> Option<char> {
        self.rest().chars().nth(1)
    }

    fn bump(&mut self) -> Option<char> {
        let c = self.peek()?;
        self.pos += c.len_utf8();
        Some(c)
    }

    fn eat(&mut self, c: char) -> bool {
        if self.peek() == Some(c) {
            self.pos += c.len_utf8();
            true
        } else {
            false
        }
    }

    fn skip_ws(&mut self) {
        while let Some(c) = self.peek() {
            if matches!(c, ' ' | '\t' | '\n' | '\r' | '\x0c') {
                self.pos += 1;
            } else if c == '\\' && matches!(self.peek_second(), Some('\n' | '\r')) {
                // An explicit line continuation.
                self.pos += 1;
            } else {
                break;
            }
        }
    }

    fn slice(&self, start: usize, end: usize) -> &str {
        self.src.get(start..end).unwrap_or("")
    }

    fn unexpected(&self, expected: &'static str) -> ParseActionError {
        match self.peek() {
            Some(found) => ParseActionError::UnexpectedChar { offset: self.pos, found, expected },
            None => ParseActionError::UnexpectedEnd { offset: self.pos, expected },
        }
    }

    fn parse_call(mut self) -> Result<Function, ParseActionError> {
        self.skip_ws();
        if self.peek().is_none() {
            return Err(ParseActionError::Empty { offset: self.pos });
        }
        if !self.peek().is_some_and(is_ident_start) {
            return Err(self.unexpected("a function name"));
        }
        let name = self.dotted_name(true)?;
        self.skip_ws();
        if !self.eat('(') {
            return Err(self.unexpected("`(` after the function name"));
        }
        let (args, kwargs) = self.arguments()?;
        self.skip_ws();
        if self.peek().is_some() {
            return Err(ParseActionError::TrailingInput { offset: self.pos });
        }
        Ok(Function { name, args, kwargs, ..Function::default() })
    }

    /// Reads an identifier; the current character is known to start one.
    fn identifier(&mut self) -> &str {
        let start = self.pos;
        while self.peek().is_some_and(is_ident_continue) {
            self.bump();
        }
        self.slice(start, self.pos)
    }

    /// Reads `a.b.c`; with `check_keywords`, refuses Python keywords as parts.
    fn dotted_name(&mut self, check_keywords: bool) -> Result<String, ParseActionError> {
        let mut name = String::new();
        loop {
            let start = self.pos;
            let part = self.identifier().to_owned();
            if check_keywords && is_python_keyword(&part) {
                return Err(ParseActionError::ReservedWord { offset: start, word: part });
            }
            name.push_str(&part);
            let before_dot = self.pos;
            self.skip_ws();
            if !self.eat('.') {
                self.pos = before_dot;
                return Ok(name);
            }
            self.skip_ws();
            if !self.peek().is_some_and(is_ident_start) {
                return Err(self.unexpected("a name after `.`"));
            }
            name.push('.');
        }
    }

    /// Reads the arguments after `(`, through `)`.
    fn arguments(&mut self) -> Result<(Vec<Value>, Map<String, Value>), ParseActionError> {
        let mut args = Vec::new();
        let mut kwargs = Map::new();
        loop {
            self.skip_ws();
            if self.eat(')') {
                break;
            }
            let start = self.pos;
            if let Some(keyword) = self.keyword()? {
                let value = self.value()?;
                if kwargs.contains_key(&keyword) {
                    return Err(ParseActionError::DuplicateKeyword { offset: start, name: keyword });
                }
                kwargs.insert(keyword, value);
            } else {
                let value = self.value()?;
                if !kwargs.is_empty() {
                    return Err(ParseActionError::PositionalAfterKeyword { offset: start });
                }
                args.push(value);
            }
            self.skip_ws();
            if self.eat(',') {
                continue;
            }
            if self.eat(')') {
                break;
            }
            return Err(self.unexpected("`,` or `)`"));
        }
        Ok((args, kwargs))
    }

    /// Reads `name =` and returns the name, or reads nothing when the next argument is
    /// positional.
    fn keyword(&mut self) -> Result<Option<String>, ParseActionError> {
        if !self.peek().is_some_and(is_ident_start) {
            return Ok(None);
        }
        let start = self.pos;
        let name = self.identifier().to_owned();
        self.skip_ws();
        if self.peek() == Some('=') && self.peek_second() != Some('=') {
            if is_python_keyword(&name) {
                return Err(ParseActionError::ReservedWord { offset: start, word: name });
            }
            self.pos += 1;
            return Ok(Some(name));
        }
        self.pos = start;
        Ok(None)
    }

    fn value(&mut self) -> Result<Value, ParseActionError> {
        self.skip_ws();
        let start = self.pos;
        let Some(c) = self.peek() else {
            return Err(ParseActionError::UnexpectedEnd { offset: start, expected: "a value" });
        };
        match c {
            '\'' | '"' => self.string(start, false).map(Value::String),
            'r' | 'R' | 'u' | 'U' if matches!(self.peek_second(), Some('\'' | '"')) => {
                self.bump();
                self.string(start, matches!(c, 'r' | 'R')).map(Value::String)
            }
            '0'..='9' => self.number(start, ""),
            '.' if self.peek_second().is_some_and(|c| c.is_ascii_digit()) => self.number(start, ""),
            '-' | '+' => {
                self.bump();
                self.skip_ws();
                let digit_follows = match self.peek() {
                    Some('0'..='9') => true,
                    Some('.') => self.peek_second().is_some_and(|c| c.is_ascii_digit()),
                    _ => false,
                };
                if !digit_follows {
                    return Err(self.unexpected("a number after the sign"));
                }
                self.number(start, if c == '-' { "-" } else { "" })
            }
            '[' => self.sequence(start, ']').map(Value::Array),
            '(' => self.tuple(start),
            '{' => self.dict(start),
            c if is_ident_start(c) => self.name_value(start),
            _ => Err(self.unexpected("a value")),
        }
    }

    /// A name in value position: `True`, `False`, `None`, or an error.
    fn name_value(&mut self, start: usize) -> Result<Value, ParseActionError> {
        let name = self.dotted_name(false)?;
        let after = self.pos;
        self.skip_ws();
        if self.peek() == Some('(') {
            return Err(ParseActionError::NestedCall { offset: start, name });
        }
        self.pos = after;
        match name.as_str() {
            "True" => Ok(Value::Bool(true)),
            "False" => Ok(Value::Bool(false)),
            "None" => Ok(Value::Null),
            _ => Err(ParseActionError::UnknownName { offset: start, name }),
        }
    }

    fn enter(&mut self, offset: usize) -> Result<(), ParseActionError> {
        self.depth += 1;
        if self.depth > MAX_LITERAL_DEPTH {
            return Err(ParseActionError::TooDeep { offset, limit: MAX_LITERAL_DEPTH });
        }
        Ok(())
    }

    /// Reads items through `close`; the opening bracket is at `start`.
    fn sequence(&mut self, start: usize, close: char) -> Result<Vec<Value>, ParseActionError> {
        self.enter(start)?;
        self.bump();
        let items = self.items(close, Vec::new())?;
        self.depth -= 1;
        Ok(items)
    }

    /// Reads `item, item, …` through `close`, after `items` already read.
    fn items(&mut self, close: char, mut items: Vec<Value>) -> Result<Vec<Value>, ParseActionError> {
        let expected = if close == ']' { "`,` or `]`" } else { "`,` or `)`" };
        loop {
            self.skip_ws();
            if self.eat(close) {
                return Ok(items);
            }
            items.push(self.value()?);
            self.skip_ws();
            if self.eat(',') {
                continue;
            }
            if self.eat(close) {
                return Ok(items);
            }
            return Err(self.unexpected(expected));
        }
    }

    /// `()`, `(x)` (just `x`), `(x,)` and `(x, y)`.
    fn tuple(&mut self, start: usize) -> Result<Value, ParseActionError> {
        self.enter(start)?;
        self.bump();
        self.skip_ws();
        let value = if self.eat(')') {
            Value::Array(Vec::new())
        } else {
            let first = self.value()?;
            self.skip_ws();
            if self.eat(')') {
                first
            } else if self.eat(',') {
                Value::Array(self.items(')', vec![first])?)
            } else {
                return Err(self.unexpected("`,` or `)`"));
            }
        };
        self.depth -= 1;
        Ok(value)
    }

    fn dict(&mut self, start: usize) -> Result<Value, ParseActionError> {
        self.enter(start)?;
        self.bump();
        let mut map = Map::new();
        let mut first = true;
        loop {
            self.skip_ws();
            if self.eat('}') {
                break;
            }
            let key_start = self.pos;
            let key = self.value()?;
            self.skip_ws();
            if first && matches!(self.peek(), Some(',' | '}')) {
                return Err(ParseActionError::SetNotSupported { offset: start });
            }
            first = false;
            if !self.eat(':') {
                return Err(self.unexpected("`:`"));
            }
            let Value::String(key) = key else {
                return Err(ParseActionError::NonStringKey { offset: key_start });
            };
            let value = self.value()?;
            map.insert(key, value);
            self.skip_ws();
            if self.eat(',') {
                continue;
            }
            if self.eat('}') {
                break;
            }
            return Err(self.unexpected("`,` or `}`"));
        }
        self.depth -= 1;
        Ok(Value::Object(map))
    }

    /// Reads a string literal whose opening quote is the current character; `start` is
    /// where the literal (its prefix included) starts.
    fn string(&mut self, start: usize, raw: bool) -> Result<String, ParseActionError> {
        let Some(quote) = self.bump() else {
            return Err(ParseActionError::UnterminatedString { offset: start });
        };
        let triple = self.peek() == Some(quote) && self.peek_second() == Some(quote);
        if triple {
            self.pos += 2 * quote.len_utf8();
        }
        let mut out = String::new();
        loop {
            let Some(c) = self.bump() else {
                return Err(ParseActionError::UnterminatedString { offset: start });
            };
            if c == quote {
                if !triple {
                    return Ok(out);
                }
                if self.peek() == Some(quote) && self.peek_second() == Some(quote) {
                    self.pos += 2 * quote.len_utf8();
                    return Ok(out);
                }
                out.push(c);
            } else if (c == '\n' || c == '\r') && !triple {
                return Err(ParseActionError::UnterminatedString { offset: start });
            } else if c == '\\' {
                let escape_start = self.pos - 1;
                let Some(next) = self.bump() else {
                    return Err(ParseActionError::UnterminatedString { offset: start });
                };
                if raw {
                    out.push('\\');
                    out.push(next);
                } else {
                    self.escape(next, escape_start, &mut out)?;
                }
            } else {
                out.push(c);
            }
        }
    }

    /// Decodes the escape `\` + `c`; `offset` is where the backslash is.
    fn escape(&mut self, c: char, offset: usize, out: &mut String) -> Result<(), ParseActionError> {
        match c {
            '\n' => {}
            '\r' => {
                self.eat('\n');
            }
            '\\' | '\'' | '"' => out.push(c),
            'a' => out.push('\x07'),
            'b' => out.push('\x08'),
            'f' => out.push('\x0c'),
            'n' => out.push('\n'),
            'r' => out.push('\r'),
            't' => out.push('\t'),
            'v' => out.push('\x0b'),
            '0'..='7' => {
                let mut code = c.to_digit(8).unwrap_or(0);
                for _ in 0..2 {
                    match self.peek().and_then(|d| d.to_digit(8)) {
                        Some(digit) => {
                            code = code * 8 + digit;
                            self.pos += 1;
                        }
                        None => break,
                    }
                }
                out.push(char::from_u32(code).ok_or(ParseActionError::InvalidEscape { offset })?);
            }
            'x' | 'u' | 'U' => {
                let len = match c {
                    'x' => 2,
                    'u' => 4,
                    _ => 8,
                };
                let mut code = 0u32;
                for _ in 0..len {
                    let digit = self
                        .peek()
                        .and_then(|d| d.to_digit(16))
                        .ok_or(ParseActionError::InvalidEscape { offset })?;
                    code = code * 16 + digit;
                    self.pos += 1;
                }
                out.push(char::from_u32(code).ok_or(ParseActionError::InvalidEscape { offset })?);
            }
            'N' => return Err(ParseActionError::InvalidEscape { offset }),
            // Python keeps unknown escapes as they are.
            other => {
                out.push('\\');
                out.push(other);
            }
        }
        Ok(())
    }

    /// Reads a decimal number at the current position; `start` is where its sign (if
    /// any) is, and `sign` is `"-"` or `""`.
    fn number(&mut self, start: usize, sign: &str) -> Result<Value, ParseActionError> {
        let digits_start = self.pos;
        let mut is_float = false;
        self.digits();
        if self.peek() == Some('.') {
            is_float = true;
            self.pos += 1;
            self.digits();
        }
        if matches!(self.peek(), Some('e' | 'E')) {
            is_float = true;
            self.pos += 1;
            if matches!(self.peek(), Some('+' | '-')) {
                self.pos += 1;
            }
            if !self.peek().is_some_and(|c| c.is_ascii_digit()) {
                return Err(self.invalid_number(start));
            }
            self.digits();
        }
        if self.peek().is_some_and(|c| is_ident_continue(c) || c == '.') {
            return Err(self.invalid_number(start));
        }
        let digits = self.slice(digits_start, self.pos);
        let text = format!("{sign}{digits}");
        if is_float {
            return match text.parse::<f64>().ok().and_then(serde_json::Number::from_f64) {
                Some(number) => Ok(Value::Number(number)),
                None => Err(ParseActionError::NumberOutOfRange { offset: start, text }),
            };
        }
        if digits.len() > 1 && digits.starts_with('0') && digits.bytes().any(|b| b != b'0') {
            return Err(ParseActionError::InvalidNumber { offset: start, text });
        }
        let number = if sign == "-" {
            text.parse::<i64>().ok().map(Value::from)
        } else {
            digits.parse::<u64>().ok().map(Value::from)
        };
        number.ok_or(ParseActionError::NumberOutOfRange { offset: start, text })
    }

    fn digits(&mut self) {
        while self.peek().is_some_and(|c| c.is_ascii_digit()) {
            self.pos += 1;
        }
    }

    /// An invalid-number error holding the text from `start` through the next
    /// character that cannot continue a number.
    fn invalid_number(&mut self, start: usize) -> ParseActionError {
        while self.peek().is_some_and(|c| is_ident_continue(c) || c == '.') {
            self.bump();
        }
        ParseActionError::InvalidNumber { offset: start, text: self.slice(start, self.pos).to_owned() }
    }
}

// ---------------------------------------------------------------------------------------
// Function and tool outputs.
// ---------------------------------------------------------------------------------------

/// What a [`FunctionOutput`] ran: a call, or an expression of one.
///
/// Untagged: an object with an `action` reads as an expression, any other as a call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(untagged)]
pub enum FunctionInput {
    /// A call expression.
    Expression(FunctionExpression),
    /// A call.
    Function(Function),
}

impl From<Function> for FunctionInput {
    fn from(function: Function) -> Self {
        Self::Function(function)
    }
}

impl From<FunctionExpression> for FunctionInput {
    fn from(expression: FunctionExpression) -> Self {
        Self::Expression(expression)
    }
}

/// The output of a tool: a function, a class or a module.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct FunctionOutput {
    /// The function's name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// The call or expression that was run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input: Option<FunctionInput>,
    /// The call parsed from an expression input.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parsed_input: Option<Function>,
    /// What the function returned (`null` when nothing).
    #[serde(default, skip_serializing_if = "Value::is_null")]
    pub output: Value,
    /// The error, when the call failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl FunctionOutput {
    /// The successful output of `input`, named after it. An expression input is parsed
    /// into `parsed_input` when it parses.
    #[must_use]
    pub fn success(input: impl Into<FunctionInput>, output: Value) -> Self {
        Self { output, ..Self::for_input(input.into()) }
    }

    /// The failure of `input`, named after it.
    #[must_use]
    pub fn failure(input: impl Into<FunctionInput>, error: impl Into<String>) -> Self {
        Self { error: Some(error.into()), ..Self::for_input(input.into()) }
    }

    fn for_input(input: FunctionInput) -> Self {
        let parsed_input = match &input {
            FunctionInput::Function(_) => None,
            FunctionInput::Expression(expression) => expression.to_function().ok(),
        };
        let name = match &input {
            FunctionInput::Function(function) => Some(function.name.clone()),
            FunctionInput::Expression(_) => parsed_input.as_ref().map(|function| function.name.clone()),
        };
        Self { name, input: Some(input), parsed_input, output: Value::Null, error: None }
    }

    /// Whether the call succeeded (there is no error).
    #[must_use]
    pub fn is_success(&self) -> bool {
        self.error.is_none()
    }
}

/// How a tool call ended.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum ToolOutputStatus {
    /// It completed.
    #[default]
    Success,
    /// It was cancelled.
    Cancelled,
    /// It failed.
    Error,
}

/// A completed tool call, even a failed one: what it returned, what the LLM is shown,
/// and what the user is shown.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ToolOutput {
    /// What the tool returned.
    #[serde(default, skip_serializing_if = "Value::is_null")]
    pub output: Value,
    /// What the LLM sees of the output.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observation: Option<String>,
    /// What the user sees of the output.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub display: Option<String>,
    /// Whether the output streams.
    #[serde(default, deserialize_with = "null_as_default", skip_serializing_if = "std::ops::Not::not")]
    pub is_streaming: bool,
    /// More data.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<Map<String, Value>>,
    /// How the call ended.
    #[serde(default)]
    pub status: ToolOutputStatus,
}

impl ToolOutput {
    /// A successful output.
    #[must_use]
    pub fn success(output: Value) -> Self {
        Self { output, ..Self::default() }
    }

    /// A failed call; the error is the observation.
    #[must_use]
    pub fn error(error: impl Into<String>) -> Self {
        Self { observation: Some(error.into()), status: ToolOutputStatus::Error, ..Self::default() }
    }

    /// A cancelled call; the reason is the observation.
    #[must_use]
    pub fn cancelled(reason: impl Into<String>) -> Self {
        Self { observation: Some(reason.into()), status: ToolOutputStatus::Cancelled, ..Self::default() }
    }

    /// The same output with this observation.
    #[must_use]
    pub fn with_observation(mut self, observation: impl Into<String>) -> Self {
        self.observation = Some(observation.into());
        self
    }

    /// The same output with this display text.
    #[must_use]
    pub fn with_display(mut self, display: impl Into<String>) -> Self {
        self.display = Some(display.into());
        self
    }

    /// Whether the call completed successfully.
    #[must_use]
    pub fn is_success(&self) -> bool {
        self.status == ToolOutputStatus::Success
    }
}

/// The call an agent is about to run and asks permission for.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct FunctionRequest {
    /// The tool call's id.
    #[serde(default = "new_id")]
    #[schemars(transform = drop_default)]
    pub id: String,
    /// The tool's name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_name: Option<String>,
    /// The call.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool: Option<Function>,
    /// What to show the user who confirms the call.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub confirmation_details: Option<Value>,
}

impl FunctionRequest {
    /// A request, with a new id, to run `tool`.
    #[must_use]
    pub fn new(tool: Function) -> Self {
        Self {
            id: new_id(),
            tool_name: Some(tool.name.clone()),
            tool: Some(tool),
            confirmation_details: None,
        }
    }
}

// ---------------------------------------------------------------------------------------
// Agent steps and runner results.
// ---------------------------------------------------------------------------------------

/// An action a [`StepOutput`] can hold. [`StepOutput::to_prompt_str`] writes the thought
/// and action of [`FunctionExpression`] actions only, as AdalFlow does.
pub trait StepAction {
    /// The action as a function expression, when it is one.
    fn as_function_expression(&self) -> Option<&FunctionExpression> {
        None
    }
}

impl StepAction for FunctionExpression {
    fn as_function_expression(&self) -> Option<&FunctionExpression> {
        Some(self)
    }
}

impl StepAction for Function {}

impl StepAction for String {}

impl StepAction for Value {}

/// One step of a serial planning agent such as ReAct: the prompt, the action, the
/// function parsed from it, and what running it returned.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(bound(deserialize = "A: Deserialize<'de>"))]
pub struct StepOutput<A = Function> {
    /// The step's position, from 0.
    #[serde(default)]
    pub step: usize,
    /// The planner prompt of this step.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub planner_prompt: Option<String>,
    /// The action the planner chose.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub action: Option<A>,
    /// The function parsed from the action.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub function: Option<Function>,
    /// The result shown for the action.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observation: Option<String>,
    /// The step's context.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ctx: Option<Map<String, Value>>,
}

impl<A> Default for StepOutput<A> {
    fn default() -> Self {
        Self { step: 0, planner_prompt: None, action: None, function: None, observation: None, ctx: None }
    }
}

impl<A> StepOutput<A> {
    /// An empty step at `step`.
    #[must_use]
    pub fn new(step: usize) -> Self {
        Self { step, ..Self::default() }
    }
}

impl<A: StepAction> StepOutput<A> {
    /// The step as a JSON object for the next prompt, as AdalFlow writes it
    /// (`json.dumps`, so `", "` and `": "` separators): the `thought` (when not empty)
    /// and `action` of a function-expression action, then the `observation` when not
    /// empty. Non-ASCII text is kept as is, not `\u`-escaped.
    #[must_use]
    pub fn to_prompt_str(&self) -> String {
        let mut fields: Vec<(&str, &str)> = Vec::new();
        if let Some(expression) = self.action.as_ref().and_then(StepAction::as_function_expression) {
            if let Some(thought) = expression.thought.as_deref().filter(|t| !t.is_empty()) {
                fields.push(("thought", thought));
            }
            fields.push(("action", &expression.action));
        }
        if let Some(observation) = self.observation.as_deref().filter(|o| !o.is_empty()) {
            fields.push(("observation", observation));
        }
        let mut out = String::from("{");
        for (i, (key, value)) in fields.iter().enumerate() {
            if i > 0 {
                out.push_str(", ");
            }
            let _ = write!(out, "\"{key}\": {}", Value::String((*value).to_owned()));
        }
        out.push('}');
        out
    }
}

/// The result of an agent run: its steps, and the answer or the error.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(bound(deserialize = "A: Deserialize<'de>"))]
pub struct RunnerResult<A = Function> {
    /// The steps, in order.
    #[serde(default)]
    pub step_history: Vec<StepOutput<A>>,
    /// The final answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub answer: Option<String>,
    /// The error, when the run failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The run's context.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ctx: Option<Map<String, Value>>,
}

impl<A> Default for RunnerResult<A> {
    fn default() -> Self {
        Self { step_history: Vec::new(), answer: None, error: None, ctx: None }
    }
}

impl<A> RunnerResult<A> {
    /// Whether the run ended without an error.
    #[must_use]
    pub fn is_success(&self) -> bool {
        self.error.is_none()
    }
}

// ---------------------------------------------------------------------------------------
// Generator output.
// ---------------------------------------------------------------------------------------

/// Generated images: one string or several, each base64 data, a data URI or a URL.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(untagged)]
pub enum GeneratorImages {
    /// One image.
    One(String),
    /// Several images.
    Many(Vec<String>),
}

impl GeneratorImages {
    /// The images as a slice, one image or many.
    #[must_use]
    pub fn as_slice(&self) -> &[String] {
        match self {
            Self::One(image) => std::slice::from_ref(image),
            Self::Many(images) => images,
        }
    }
}

/// An image format recognised by [`GeneratorOutput::decode_images`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum ImageFormat {
    /// PNG.
    Png,
    /// JPEG.
    Jpeg,
    /// GIF.
    Gif,
    /// WebP.
    Webp,
    /// BMP.
    Bmp,
}

impl ImageFormat {
    /// The format of these bytes, from their magic number.
    #[must_use]
    pub fn detect(bytes: &[u8]) -> Option<Self> {
        if bytes.starts_with(b"\x89PNG\r\n\x1a\n") {
            Some(Self::Png)
        } else if bytes.starts_with(&[0xFF, 0xD8, 0xFF]) {
            Some(Self::Jpeg)
        } else if bytes.starts_with(b"GIF87a") || bytes.starts_with(b"GIF89a") {
            Some(Self::Gif)
        } else if bytes.starts_with(b"RIFF") && bytes.get(8..12) == Some(&b"WEBP"[..]) {
            Some(Self::Webp)
        } else if bytes.starts_with(b"BM") {
            Some(Self::Bmp)
        } else {
            None
        }
    }

    /// The format of a MIME type such as `image/png`.
    #[must_use]
    pub fn from_mime(mime: &str) -> Option<Self> {
        match mime.to_ascii_lowercase().as_str() {
            "image/png" => Some(Self::Png),
            "image/jpeg" | "image/jpg" => Some(Self::Jpeg),
            "image/gif" => Some(Self::Gif),
            "image/webp" => Some(Self::Webp),
            "image/bmp" | "image/x-ms-bmp" => Some(Self::Bmp),
            _ => None,
        }
    }

    /// The MIME type, such as `image/png`.
    #[must_use]
    pub const fn mime_type(self) -> &'static str {
        match self {
            Self::Png => "image/png",
            Self::Jpeg => "image/jpeg",
            Self::Gif => "image/gif",
            Self::Webp => "image/webp",
            Self::Bmp => "image/bmp",
        }
    }

    /// The usual file extension, such as `png`.
    #[must_use]
    pub const fn extension(self) -> &'static str {
        match self {
            Self::Png => "png",
            Self::Jpeg => "jpg",
            Self::Gif => "gif",
            Self::Webp => "webp",
            Self::Bmp => "bmp",
        }
    }
}

/// One decoded image.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecodedImage {
    /// Its position in [`GeneratorOutput::images`].
    pub index: usize,
    /// Its format, from the magic number or else the data URI's MIME type.
    pub format: Option<ImageFormat>,
    /// The bytes.
    pub bytes: Vec<u8>,
}

/// Why an image of [`GeneratorOutput::images`] could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ImageDecodeError {
    /// The image is blank or decodes to nothing.
    #[error("image {index} is empty")]
    Empty {
        /// Its position.
        index: usize,
    },
    /// The image is an `http(s)` URL; fetching it is I/O, which this crate does not do.
    #[error("image {index} is a URL, not image data")]
    Url {
        /// Its position.
        index: usize,
    },
    /// The image is a malformed data URI.
    #[error("image {index} is an invalid data URI: {source}")]
    InvalidDataUri {
        /// Its position.
        index: usize,
        /// What is wrong with it.
        #[source]
        source: DataUriError,
    },
    /// The image is not valid base64.
    #[error("image {index} is not valid base64")]
    InvalidBase64 {
        /// Its position.
        index: usize,
    },
}

const LENIENT_PADDING: GeneralPurposeConfig =
    GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent);
const STANDARD_LENIENT: GeneralPurpose = GeneralPurpose::new(&alphabet::STANDARD, LENIENT_PADDING);
const URL_SAFE_LENIENT: GeneralPurpose = GeneralPurpose::new(&alphabet::URL_SAFE, LENIENT_PADDING);

fn decode_image(index: usize, image: &str) -> Result<DecodedImage, ImageDecodeError> {
    let image = image.trim();
    if image.is_empty() {
        return Err(ImageDecodeError::Empty { index });
    }
    let lower_prefix = image.get(..8).unwrap_or(image).to_ascii_lowercase();
    if lower_prefix.starts_with("http://") || lower_prefix.starts_with("https://") {
        return Err(ImageDecodeError::Url { index });
    }
    if image.starts_with("data:") {
        let uri =
            DataUri::parse(image).map_err(|source| ImageDecodeError::InvalidDataUri { index, source })?;
        let bytes = uri.decode();
        let format = ImageFormat::detect(&bytes).or_else(|| ImageFormat::from_mime(uri.mime()));
        return Ok(DecodedImage { index, format, bytes });
    }
    let compact: String = image.chars().filter(|c| !c.is_ascii_whitespace()).collect();
    let bytes = STANDARD_LENIENT
        .decode(&compact)
        .or_else(|_| URL_SAFE_LENIENT.decode(&compact))
        .map_err(|_| ImageDecodeError::InvalidBase64 { index })?;
    if bytes.is_empty() {
        return Err(ImageDecodeError::Empty { index });
    }
    Ok(DecodedImage { index, format: ImageFormat::detect(&bytes), bytes })
}

/// One event of a generator output, as [`GeneratorOutput::events`] lists them.
#[derive(Debug, Clone, PartialEq)]
pub enum GeneratorEvent<'a, T> {
    /// A raw streamed chunk from `raw_response`.
    Raw(&'a Value),
    /// The final data, when no raw chunk is left.
    Data(&'a T),
}

/// The output of a generator (one LLM call and its output parsing).
///
/// When the call and the parsing succeed, `data` holds the result and `error` is
/// `None`; otherwise `data` is `None` and `error` says why. `raw_response` is the
/// model's raw text, or the array of its streamed chunks.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(bound(deserialize = "T: Deserialize<'de>"))]
pub struct GeneratorOutput<T = Value> {
    /// The output's id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// The generator's input, such as the prompt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input: Option<Value>,
    /// The final output, after output parsing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<T>,
    /// The model's thinking.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub thinking: Option<String>,
    /// The tool the model called.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_use: Option<Function>,
    /// Generated images (base64, data URIs or URLs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub images: Option<GeneratorImages>,
    /// The error, when the call or the parsing failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Token usage.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<CompletionUsage>,
    /// The model's raw text, or its streamed chunks as an array.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub raw_response: Option<Value>,
    /// The model client's raw API response.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_response: Option<Value>,
    /// More data.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<Map<String, Value>>,
}

/// AdalFlow's `GeneratorOutput[object]`.
pub type GeneratorOutputType = GeneratorOutput<Value>;

impl<T> Default for GeneratorOutput<T> {
    fn default() -> Self {
        Self {
            id: None,
            input: None,
            data: None,
            thinking: None,
            tool_use: None,
            images: None,
            error: None,
            usage: None,
            raw_response: None,
            api_response: None,
            metadata: None,
        }
    }
}

impl<T> GeneratorOutput<T> {
    /// A successful output holding `data`.
    #[must_use]
    pub fn success(data: T) -> Self {
        Self { data: Some(data), ..Self::default() }
    }

    /// A failed output.
    #[must_use]
    pub fn failure(error: impl Into<String>) -> Self {
        Self { error: Some(error.into()), ..Self::default() }
    }

    /// Whether there is no error.
    #[must_use]
    pub fn is_success(&self) -> bool {
        self.error.is_none()
    }

    /// The events AdalFlow's async `stream_events` would yield, listed synchronously:
    /// the chunks of `raw_response` when it is a non-empty array of streamed chunks,
    /// otherwise the final `data` when there is some, otherwise nothing. Streaming
    /// itself belongs to the async crates.
    #[must_use]
    pub fn events(&self) -> Vec<GeneratorEvent<'_, T>> {
        match &self.raw_response {
            Some(Value::Array(chunks)) if !chunks.is_empty() => {
                chunks.iter().map(GeneratorEvent::Raw).collect()
            }
            _ => self.data.iter().map(GeneratorEvent::Data).collect(),
        }
    }

    /// Decodes the generated images in memory, in place of AdalFlow's `save_images`
    /// (this crate does no I/O). Each image is a data URI or raw base64 (standard or
    /// URL-safe alphabet, padding optional, whitespace ignored); its format comes from
    /// its magic number, or else from the data URI's MIME type. No images give an empty
    /// list; the first image that is a URL, blank or malformed gives an error.
    pub fn decode_images(&self) -> Result<Vec<DecodedImage>, ImageDecodeError> {
        let Some(images) = &self.images else {
            return Ok(Vec::new());
        };
        images.as_slice().iter().enumerate().map(|(index, image)| decode_image(index, image)).collect()
    }
}

// ---------------------------------------------------------------------------------------
// Documents.
// ---------------------------------------------------------------------------------------

/// A text with optional metadata and vector, as retrievers, splitters and stores use.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Document {
    /// The text.
    pub text: String,
    /// Metadata, also usable to filter at retrieval time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub meta_data: Option<Map<String, Value>>,
    /// The vector representation.
    #[serde(default, deserialize_with = "null_as_default", skip_serializing_if = "Vec::is_empty")]
    pub vector: Vec<f32>,
    /// The document's id; a new one when the field is missing.
    #[serde(default = "new_optional_id")]
    #[schemars(transform = drop_default)]
    pub id: Option<String>,
    /// The position of this chunk in its original document.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub order: Option<usize>,
    /// A score, typically from retrieval.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub score: Option<f64>,
    /// The id of the document this chunk comes from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent_doc_id: Option<String>,
    /// An estimate of the text's token count.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub estimated_num_tokens: Option<usize>,
}

/// Why a JSON value is not a [`Document`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DocumentError {
    /// The value is not a JSON object.
    #[error("a document must be a JSON object")]
    NotAnObject,
    /// A required field is missing.
    #[error("a document needs the field {field:?}")]
    MissingField {
        /// The field.
        field: &'static str,
    },
    /// A field has the wrong type.
    #[error("invalid document: {message}")]
    InvalidField {
        /// What serde reported.
        message: String,
    },
}

impl Document {
    /// A document holding `text`, with a new id.
    #[must_use]
    pub fn new(text: impl Into<String>) -> Self {
        Self {
            text: text.into(),
            meta_data: None,
            vector: Vec::new(),
            id: new_optional_id(),
            order: None,
            score: None,
            parent_doc_id: None,
            estimated_num_tokens: None,
        }
    }

    /// The same document with this metadata.
    #[must_use]
    pub fn with_meta_data(mut self, meta_data: Map<String, Value>) -> Self {
        self.meta_data = Some(meta_data);
        self
    }

    /// The same document with this vector.
    #[must_use]
    pub fn with_vector(mut self, vector: Vec<f32>) -> Self {
        self.vector = vector;
        self
    }

    /// A document from a JSON object such as
    /// `{"id": "123", "text": "Hello world", "meta_data": {"title": "Greeting"}}`.
    ///
    /// `text` is required. A missing, `null` or empty `id` gets a new one. Unlike
    /// AdalFlow, `meta_data` may be missing, and `estimated_num_tokens` is not computed
    /// (there is no tokenizer here).
    pub fn from_dict(doc: Value) -> Result<Self, DocumentError> {
        let Value::Object(mut map) = doc else {
            return Err(DocumentError::NotAnObject);
        };
        if !map.contains_key("text") {
            return Err(DocumentError::MissingField { field: "text" });
        }
        let has_id = match map.get("id") {
            Some(Value::String(id)) => !id.is_empty(),
            Some(Value::Null) | None => false,
            Some(_) => true,
        };
        if !has_id {
            map.insert("id".to_owned(), Value::String(new_id()));
        }
        serde_json::from_value(Value::Object(map))
            .map_err(|error| DocumentError::InvalidField { message: error.to_string() })
    }
}

// ---------------------------------------------------------------------------------------
// Dialog.
// ---------------------------------------------------------------------------------------

/// What the user said in a dialog turn.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct UserQuery {
    /// The query text.
    pub query_str: String,
    /// Context or files attached to the query.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<Map<String, Value>>,
}

impl UserQuery {
    /// A query without metadata.
    #[must_use]
    pub fn new(query_str: impl Into<String>) -> Self {
        Self { query_str: query_str.into(), metadata: None }
    }
}

/// What the assistant answered in a dialog turn.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct AssistantResponse {
    /// The response text.
    pub response_str: String,
    /// More data, such as an agent's step history.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<Map<String, Value>>,
}

impl AssistantResponse {
    /// A response without metadata.
    #[must_use]
    pub fn new(response_str: impl Into<String>) -> Self {
        Self { response_str: response_str.into(), metadata: None }
    }
}

/// One turn of a dialog: a user query and the assistant's response, shaped to be a
/// database row.
///
/// AdalFlow stamps both timestamps when the turn is built; here they are stamped when
/// the query or the response is set ([`DialogTurn::set_user_query`],
/// [`DialogTurn::set_assistant_response`], [`DialogTurn::from_exchange`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct DialogTurn {
    /// The turn's id.
    #[serde(default = "new_id")]
    #[schemars(transform = drop_default)]
    pub id: String,
    /// The user's id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user_id: Option<String>,
    /// The conversation's id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub conversation_id: Option<String>,
    /// The turn's position in its conversation, from 0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub order: Option<usize>,
    /// The user's query.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user_query: Option<UserQuery>,
    /// The assistant's response.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub assistant_response: Option<AssistantResponse>,
    /// When the user asked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user_query_timestamp: Option<Timestamp>,
    /// When the assistant answered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub assistant_response_timestamp: Option<Timestamp>,
    /// More data.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<Map<String, Value>>,
    /// The turn's vector representation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vector: Option<Vec<f32>>,
}

impl Default for DialogTurn {
    fn default() -> Self {
        Self::new()
    }
}

impl DialogTurn {
    /// An empty turn with a new id.
    #[must_use]
    pub fn new() -> Self {
        Self {
            id: new_id(),
            user_id: None,
            conversation_id: None,
            order: None,
            user_query: None,
            assistant_response: None,
            user_query_timestamp: None,
            assistant_response_timestamp: None,
            metadata: None,
            vector: None,
        }
    }

    /// A turn with a query and its response, both stamped now.
    #[must_use]
    pub fn from_exchange(user_query: UserQuery, assistant_response: AssistantResponse) -> Self {
        let mut turn = Self::new();
        turn.set_user_query(user_query, None);
        turn.set_assistant_response(assistant_response, None);
        turn
    }

    /// Sets the query and its timestamp (now, when `None`).
    pub fn set_user_query(&mut self, user_query: UserQuery, user_query_timestamp: Option<Timestamp>) {
        self.user_query = Some(user_query);
        self.user_query_timestamp = Some(user_query_timestamp.unwrap_or_else(Timestamp::now));
    }

    /// Sets the response and its timestamp (now, when `None`).
    pub fn set_assistant_response(
        &mut self,
        assistant_response: AssistantResponse,
        assistant_response_timestamp: Option<Timestamp>,
    ) {
        self.assistant_response = Some(assistant_response);
        self.assistant_response_timestamp = Some(assistant_response_timestamp.unwrap_or_else(Timestamp::now));
    }
}

/// Why a [`Conversation`] refused an operation.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConversationError {
    /// No turn has this order.
    #[error("no dialog turn has order {order}")]
    UnknownOrder {
        /// The order asked for.
        order: usize,
    },
    /// The turn's own order is not where it is being put.
    #[error("the dialog turn has order {found}, expected {expected}")]
    OrderMismatch {
        /// Where the turn is being put.
        expected: usize,
        /// The turn's `order`.
        found: usize,
    },
}

/// The dialog turns of one conversation, kept in memory by a dialog app, keyed and
/// ordered by their `order`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Conversation {
    /// The conversation's id.
    #[serde(default = "new_id")]
    #[schemars(transform = drop_default)]
    pub id: String,
    /// Its name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// The user's id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user_id: Option<String>,
    /// The turns by order (JSON object keys are the orders as strings).
    #[serde(default, deserialize_with = "null_as_default")]
    pub dialog_turns: BTreeMap<usize, DialogTurn>,
    /// More data.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<Map<String, Value>>,
    /// When the conversation was created; now when the field is missing.
    #[serde(default = "now_optional")]
    #[schemars(transform = drop_default)]
    pub created_at: Option<Timestamp>,
}

impl Default for Conversation {
    fn default() -> Self {
        Self::new()
    }
}

impl Conversation {
    /// An empty conversation with a new id, created now.
    #[must_use]
    pub fn new() -> Self {
        Self {
            id: new_id(),
            name: None,
            user_id: None,
            dialog_turns: BTreeMap::new(),
            metadata: None,
            created_at: now_optional(),
        }
    }

    /// A conversation holding these turns, appended in order (AdalFlow's
    /// `dialog_turns_input` list).
    pub fn from_dialog_turns(dialog_turns: Vec<DialogTurn>) -> Result<Self, ConversationError> {
        let mut conversation = Self::new();
        for turn in dialog_turns {
            conversation.append_dialog_turn(turn)?;
        }
        Ok(conversation)
    }

    /// The order the next appended turn gets: one past the last turn's, 0 when there is
    /// none. (AdalFlow uses the number of turns, which collides with an existing order
    /// once a turn in the middle is deleted.)
    #[must_use]
    pub fn get_next_order(&self) -> usize {
        self.dialog_turns.last_key_value().map_or(0, |(order, _)| order + 1)
    }

    /// Appends a turn at [`Conversation::get_next_order`] and returns that order. A turn
    /// without an order gets it; a turn with another order is refused.
    pub fn append_dialog_turn(&mut self, mut dialog_turn: DialogTurn) -> Result<usize, ConversationError> {
        let order = self.get_next_order();
        match dialog_turn.order {
            Some(found) if found != order => {
                return Err(ConversationError::OrderMismatch { expected: order, found });
            }
            _ => dialog_turn.order = Some(order),
        }
        self.dialog_turns.insert(order, dialog_turn);
        Ok(order)
    }

    /// The turns by order.
    #[must_use]
    pub fn get_dialog_turns(&self) -> &BTreeMap<usize, DialogTurn> {
        &self.dialog_turns
    }

    /// The dialog as text, a `User: …` and an `Assistant: …` line per turn, each line
    /// ending with a newline. A turn's missing query or response is left out.
    #[must_use]
    pub fn get_chat_history_str(&self) -> String {
        let mut out = String::new();
        for turn in self.dialog_turns.values() {
            if let Some(query) = &turn.user_query {
                let _ = writeln!(out, "User: {}", query.query_str);
            }
            if let Some(response) = &turn.assistant_response {
                let _ = writeln!(out, "Assistant: {}", response.response_str);
            }
        }
        out
    }

    /// Removes and returns the turn with this order.
    pub fn delete_dialog_turn(&mut self, order: usize) -> Result<DialogTurn, ConversationError> {
        self.dialog_turns.remove(&order).ok_or(ConversationError::UnknownOrder { order })
    }

    /// Replaces the turn with this order and returns the old one. A new turn without an
    /// order gets this one; a turn with another order is refused.
    pub fn update_dialog_turn(
        &mut self,
        order: usize,
        mut dialog_turn: DialogTurn,
    ) -> Result<DialogTurn, ConversationError> {
        if let Some(found) = dialog_turn.order.filter(|found| *found != order) {
            return Err(ConversationError::OrderMismatch { expected: order, found });
        }
        let slot = self.dialog_turns.get_mut(&order).ok_or(ConversationError::UnknownOrder { order })?;
        dialog_turn.order = Some(order);
        Ok(std::mem::replace(slot, dialog_turn))
    }
}
