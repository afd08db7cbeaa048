//! Tests of the AdalFlow data classes: model types, embedder output checks, usage
//! conversions, function definitions and calls, the function-expression parser, tool and
//! step outputs, generator images, documents, dialog turns and conversations.

use agentry_types::adalflow::{
    AssistantResponse, CompletionUsage, Conversation, ConversationError, DecodedImage, DialogTurn, Document,
    DocumentError, EmbedderOutput, EmbedderOutputType, Embedding, EmbeddingError, EmbeddingUsage,
    FromFunctionError, Function, FunctionDefinition, FunctionExpression, FunctionInput, FunctionOutput,
    FunctionRequest, GeneratorEvent, GeneratorImages, GeneratorOutput, GeneratorOutputType, ImageDecodeError,
    ImageFormat, InputTokensDetails, MAX_LITERAL_DEPTH, ModelType, NORMALIZATION_TOLERANCE,
    OutputTokensDetails, ParseActionError, ResponseUsage, RetrieverOutput, RunnerResult, SchemaFormat,
    StepOutput, TokenLogProb, ToolOutput, ToolOutputStatus, UserQuery, function_name, get_model_args,
    parse_function_call_expr, to_python_literal, to_yaml_string,
};
use agentry_types::{DataUriError, Timestamp, Usage};
use base64::Engine as _;
use proptest::prelude::*;
use serde_json::{Map, Value, json};

fn object(value: Value) -> Map<String, Value> {
    match value {
        Value::Object(map) => map,
        other => panic!("not an object: {other}"),
    }
}

fn add(a: i64, b: i64) -> i64 {
    a + b
}

fn identity<T>(value: T) -> T {
    value
}

struct Calculator;

impl Calculator {
    fn multiply(a: i64, b: i64) -> i64 {
        a * b
    }
}

fn parse(action: &str) -> Function {
    parse_function_call_expr(action).unwrap_or_else(|error| panic!("{action:?} should parse: {error}"))
}

fn parse_error(action: &str) -> ParseActionError {
    match parse_function_call_expr(action) {
        Ok(function) => panic!("{action:?} should not parse, got {function:?}"),
        Err(error) => error,
    }
}

/// The only argument of `f(<literal>)`.
fn literal(text: &str) -> Value {
    let function = parse(&format!("f({text})"));
    assert_eq!(function.args.len(), 1, "{text}");
    function.args[0].clone()
}

// ---------------------------------------------------------------------------------------
// Model types.
// ---------------------------------------------------------------------------------------

#[test]
fn model_type_serializes_as_the_adalflow_member_name() {
    for model_type in ModelType::ALL {
        let json = serde_json::to_value(model_type).unwrap();
        assert_eq!(json, json!(model_type.name()));
        assert_eq!(serde_json::from_value::<ModelType>(json).unwrap(), model_type);
    }
    assert_eq!(serde_json::to_value(ModelType::LlmReasoning).unwrap(), json!("LLM_REASONING"));
    assert_eq!(serde_json::to_value(ModelType::ImageGeneration).unwrap(), json!("IMAGE_GENERATION"));
    assert!(serde_json::from_value::<ModelType>(json!("llm")).is_err());
}

#[test]
fn model_type_values_are_adalflows_and_round_trip() {
    let values: Vec<u8> = ModelType::ALL.iter().map(|model_type| model_type.value()).collect();
    assert_eq!(values, vec![1, 2, 3, 4, 5, 6]);
    for model_type in ModelType::ALL {
        assert_eq!(ModelType::from_value(model_type.value()), Some(model_type));
    }
    assert_eq!(ModelType::from_value(0), None);
    assert_eq!(ModelType::from_value(7), None);
}

#[test]
fn get_model_args_lists_the_required_model_kwargs_of_each_model_type() {
    assert_eq!(get_model_args(ModelType::Embedder), ["model"]);
    assert_eq!(get_model_args(ModelType::Llm), ["model"]);
    assert_eq!(get_model_args(ModelType::LlmReasoning), ["model"]);
    assert_eq!(get_model_args(ModelType::Reranker), ["model", "top_k", "documents", "query"]);
    assert!(get_model_args(ModelType::ImageGeneration).is_empty());
    assert!(get_model_args(ModelType::Undefined).is_empty());
    for model_type in ModelType::ALL {
        assert_eq!(model_type.model_args(), get_model_args(model_type));
    }
}

// ---------------------------------------------------------------------------------------
// Embeddings.
// ---------------------------------------------------------------------------------------

#[test]
fn embedding_reports_its_dimension_and_l2_norm() {
    let embedding = Embedding::new(vec![3.0, 4.0], Some(2));
    assert_eq!(embedding.dim(), 2);
    assert_eq!(embedding.index, Some(2));
    assert!((embedding.l2_norm() - 5.0).abs() < 1e-12);
    assert!(!embedding.is_normalized());
}

#[test]
fn embedding_is_normalized_within_the_documented_tolerance() {
    assert!((NORMALIZATION_TOLERANCE - 1e-4).abs() < f64::EPSILON);
    assert!(Embedding::new(vec![0.6, 0.8], None).is_normalized());
    assert!(Embedding::new(vec![1.00005], None).is_normalized());
    assert!(!Embedding::new(vec![1.0002], None).is_normalized());
    assert!(!Embedding::new(vec![0.9998], None).is_normalized());
    assert!(!Embedding::new(vec![], None).is_normalized(), "an empty vector is not a unit vector");
}

#[test]
fn embedder_output_length_and_embedding_dim_follow_the_first_embedding() {
    let empty = EmbedderOutput::default();
    assert_eq!(empty.length(), 0);
    assert_eq!(empty.embedding_dim(), None);

    let first_empty =
        EmbedderOutput::new(vec![Embedding::new(vec![], Some(0)), Embedding::new(vec![1.0], Some(1))]);
    assert_eq!(first_empty.length(), 2);
    assert_eq!(first_empty.embedding_dim(), None, "AdalFlow returns -1 when the first embedding is empty");

    let output = EmbedderOutput::new(vec![Embedding::new(vec![1.0, 0.0, 0.0], Some(0))]);
    assert_eq!(output.length(), 1);
    assert_eq!(output.embedding_dim(), Some(3));
}

#[test]
fn embedder_output_is_normalized_only_when_every_embedding_is_a_unit_vector() {
    assert!(!EmbedderOutput::default().is_normalized());
    let unit = EmbedderOutput::new(vec![
        Embedding::new(vec![1.0, 0.0], Some(0)),
        Embedding::new(vec![0.6, 0.8], Some(1)),
    ]);
    assert!(unit.is_normalized());
    let mixed = EmbedderOutput::new(vec![
        Embedding::new(vec![1.0, 0.0], Some(0)),
        Embedding::new(vec![3.0, 4.0], Some(1)),
    ]);
    assert!(!mixed.is_normalized(), "the second embedding has norm 5");
}

#[test]
fn embedder_output_validate_returns_the_common_dimension() {
    assert_eq!(EmbedderOutput::default().validate(), Ok(None));
    let output = EmbedderOutput::new(vec![
        Embedding::new(vec![1.0, 2.0], Some(0)),
        Embedding::new(vec![3.0, 4.0], Some(1)),
    ]);
    assert_eq!(output.validate(), Ok(Some(2)));
}

#[test]
fn embedder_output_validate_reports_embeddings_of_differing_dimensions() {
    let output = EmbedderOutput::new(vec![
        Embedding::new(vec![1.0, 2.0], Some(0)),
        Embedding::new(vec![3.0, 4.0], Some(1)),
        Embedding::new(vec![5.0, 6.0, 7.0], Some(2)),
    ]);
    let error = output.validate().unwrap_err();
    assert_eq!(error, EmbeddingError::DimensionMismatch { index: 2, expected: 2, found: 3 });
    assert_eq!(error.to_string(), "embedding 2 has 3 dimensions, but embedding 0 has 2");
}

#[test]
fn embedder_output_validate_reports_non_finite_values() {
    let output = EmbedderOutput::new(vec![
        Embedding::new(vec![1.0, 2.0], Some(0)),
        Embedding::new(vec![1.0, f32::NAN], Some(1)),
    ]);
    assert_eq!(output.validate(), Err(EmbeddingError::NonFinite { index: 1, position: 1 }));
    let infinite = EmbedderOutput::new(vec![Embedding::new(vec![f32::INFINITY], None)]);
    assert_eq!(infinite.validate(), Err(EmbeddingError::NonFinite { index: 0, position: 0 }));
}

#[test]
fn embedder_output_round_trips_through_json_and_reads_null_data_as_empty() {
    let output: EmbedderOutputType = EmbedderOutput {
        data: vec![Embedding::new(vec![0.25, -0.5], Some(0))],
        model: Some("text-embedding-3-small".to_owned()),
        usage: Some(EmbeddingUsage { prompt_tokens: 8, total_tokens: 8 }),
        error: None,
        raw_response: None,
        input: Some(vec!["hello".to_owned()]),
    };
    let json = serde_json::to_value(&output).unwrap();
    assert_eq!(
        json,
        json!({
            "data": [{"embedding": [0.25, -0.5], "index": 0}],
            "model": "text-embedding-3-small",
            "usage": {"prompt_tokens": 8, "total_tokens": 8},
            "input": ["hello"]
        })
    );
    assert_eq!(serde_json::from_value::<EmbedderOutput>(json).unwrap(), output);

    let failed: EmbedderOutput =
        serde_json::from_value(json!({"data": null, "error": "rate limited", "raw_response": {"code": 429}}))
            .unwrap();
    assert!(failed.data.is_empty());
    assert_eq!(failed.error.as_deref(), Some("rate limited"));
    assert_eq!(failed.raw_response, Some(json!({"code": 429})));
}

#[test]
fn embedding_usage_converts_to_input_only_usage() {
    let usage = Usage::from(EmbeddingUsage { prompt_tokens: 12, total_tokens: 12 });
    assert_eq!(usage, Usage::new(12, 0));
}

// ---------------------------------------------------------------------------------------
// Generator usage.
// ---------------------------------------------------------------------------------------

#[test]
fn token_log_prob_gives_its_probability_and_round_trips() {
    let log_prob = TokenLogProb::new("Hello", -0.5);
    assert!((log_prob.probability() - (-0.5f64).exp()).abs() < 1e-12);
    let json = serde_json::to_value(&log_prob).unwrap();
    assert_eq!(json, json!({"token": "Hello", "logprob": -0.5}));
    assert_eq!(serde_json::from_value::<TokenLogProb>(json).unwrap(), log_prob);
}

#[test]
fn completion_usage_sums_its_total_and_skips_missing_counts() {
    let usage = CompletionUsage::new(10, 5);
    assert_eq!(usage.total_tokens, Some(15));
    assert_eq!(
        serde_json::to_value(usage).unwrap(),
        json!({"completion_tokens": 5, "prompt_tokens": 10, "total_tokens": 15})
    );
    assert_eq!(serde_json::to_value(CompletionUsage::default()).unwrap(), json!({}));
    assert_eq!(serde_json::from_value::<CompletionUsage>(json!({})).unwrap(), CompletionUsage::default());
}

#[test]
fn completion_usage_converts_to_and_from_usage() {
    assert_eq!(Usage::from(CompletionUsage::new(10, 5)), Usage::new(10, 5));
    let partial = CompletionUsage { completion_tokens: Some(3), prompt_tokens: None, total_tokens: None };
    assert_eq!(Usage::from(partial), Usage::new(0, 3), "missing counts become zero");
    let usage = Usage { reasoning_tokens: Some(2), ..Usage::new(7, 4) };
    assert_eq!(CompletionUsage::from(usage), CompletionUsage::new(7, 4));
}

#[test]
fn token_details_default_to_zero_as_in_adalflow() {
    assert_eq!(InputTokensDetails::default().cached_tokens, Some(0));
    assert_eq!(OutputTokensDetails::default().reasoning_tokens, Some(0));
    assert_eq!(
        serde_json::from_value::<InputTokensDetails>(json!({})).unwrap(),
        InputTokensDetails::default()
    );
    assert_eq!(
        serde_json::from_value::<OutputTokensDetails>(json!({})).unwrap(),
        OutputTokensDetails::default()
    );
    assert_eq!(
        serde_json::from_value::<InputTokensDetails>(json!({"cached_tokens": null})).unwrap().cached_tokens,
        None
    );
}

#[test]
fn response_usage_sums_its_total_and_round_trips_through_json() {
    let usage = ResponseUsage::new(100, 20);
    assert_eq!(usage.total_tokens, 120);
    let json = serde_json::to_value(usage).unwrap();
    assert_eq!(
        json,
        json!({
            "input_tokens": 100,
            "output_tokens": 20,
            "total_tokens": 120,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens_details": {"reasoning_tokens": 0}
        })
    );
    assert_eq!(serde_json::from_value::<ResponseUsage>(json).unwrap(), usage);
    let without_details: ResponseUsage =
        serde_json::from_value(json!({"input_tokens": 1, "output_tokens": 2, "total_tokens": 3})).unwrap();
    assert_eq!(without_details.input_tokens_details, InputTokensDetails::default());
    assert!(serde_json::from_value::<ResponseUsage>(json!({"input_tokens": 1})).is_err());
}

#[test]
fn response_usage_converts_to_usage_with_cache_and_reasoning_details() {
    let usage = ResponseUsage {
        input_tokens_details: InputTokensDetails { cached_tokens: Some(40) },
        output_tokens_details: OutputTokensDetails { reasoning_tokens: Some(7) },
        ..ResponseUsage::new(100, 20)
    };
    let converted = Usage::from(usage);
    assert_eq!(converted.input_tokens, 100);
    assert_eq!(converted.output_tokens, 20);
    assert_eq!(converted.cache_read_tokens, Some(40));
    assert_eq!(converted.reasoning_tokens, Some(7));
}

#[test]
fn usage_survives_a_round_trip_through_response_usage() {
    for usage in [
        Usage::new(5, 6),
        Usage { cache_read_tokens: Some(0), reasoning_tokens: Some(3), ..Usage::new(5, 6) },
        Usage { cache_read_tokens: Some(2), ..Usage::new(5, 6) },
    ] {
        let response = ResponseUsage::from(usage);
        assert_eq!(response.total_tokens, 11);
        assert_eq!(Usage::from(response), usage);
    }
}

// ---------------------------------------------------------------------------------------
// Retriever output.
// ---------------------------------------------------------------------------------------

#[test]
fn retriever_output_defaults_to_string_queries_and_documents() {
    let document = Document::new("Paris is the capital of France.");
    let output: RetrieverOutput = RetrieverOutput::new(vec![3, 1])
        .with_scores(vec![0.9, 0.4])
        .with_query("capital of France".to_owned())
        .with_documents(vec![document.clone()]);
    assert_eq!(output.doc_indices, vec![3, 1]);
    assert_eq!(output.doc_scores, Some(vec![0.9, 0.4]));
    assert_eq!(output.query.as_deref(), Some("capital of France"));
    assert_eq!(output.documents, Some(vec![document]));

    let json = serde_json::to_value(&output).unwrap();
    assert_eq!(json["doc_indices"], json!([3, 1]));
    assert_eq!(json["query"], json!("capital of France"));
    assert_eq!(serde_json::from_value::<RetrieverOutput>(json).unwrap(), output);
}

#[test]
fn retriever_output_is_generic_over_query_and_document_types() {
    let output: RetrieverOutput<Vec<f32>, String> =
        RetrieverOutput::new(vec![0]).with_query(vec![0.5, 0.5]).with_documents(vec!["doc".to_owned()]);
    let json = serde_json::to_value(&output).unwrap();
    assert_eq!(json, json!({"doc_indices": [0], "query": [0.5, 0.5], "documents": ["doc"]}));
    assert_eq!(serde_json::from_value::<RetrieverOutput<Vec<f32>, String>>(json).unwrap(), output);
    let bare: RetrieverOutput = RetrieverOutput::new(vec![]);
    assert_eq!(serde_json::to_value(&bare).unwrap(), json!({"doc_indices": []}));
    assert!(serde_json::from_value::<RetrieverOutput>(json!({})).is_err(), "doc_indices is required");
}

// ---------------------------------------------------------------------------------------
// Function definitions and YAML.
// ---------------------------------------------------------------------------------------

fn add_definition() -> FunctionDefinition {
    FunctionDefinition::new("add", Some("Add two numbers.")).with_parameters(object(json!({
        "type": "object",
        "properties": {"a": {"type": "int"}, "b": {"type": "int"}},
        "required": ["a", "b"]
    })))
}

#[test]
fn function_definition_schema_str_in_json_is_indented_by_four_spaces_in_field_order() {
    let expected = r#"{
    "func_name": "add",
    "func_desc": "Add two numbers.",
    "func_parameters": {
        "properties": {
            "a": {
                "type": "int"
            },
            "b": {
                "type": "int"
            }
        },
        "required": [
            "a",
            "b"
        ],
        "type": "object"
    }
}"#;
    assert_eq!(add_definition().fn_schema_str(SchemaFormat::Json), expected);
    assert_eq!(SchemaFormat::default(), SchemaFormat::Json);
}

#[test]
fn function_definition_schema_str_in_yaml_is_block_style() {
    let expected = "\
func_name: add
func_desc: Add two numbers.
func_parameters:
  properties:
    a:
      type: int
    b:
      type: int
  required:
  - a
  - b
  type: object
";
    assert_eq!(add_definition().fn_schema_str(SchemaFormat::Yaml), expected);
    let bare = FunctionDefinition::new("ping", None);
    assert_eq!(bare.fn_schema_str(SchemaFormat::Yaml), "func_name: ping\nfunc_parameters: {}\n");
    assert_eq!(
        bare.fn_schema_str(SchemaFormat::Json),
        "{\n    \"func_name\": \"ping\",\n    \"func_parameters\": {}\n}"
    );
}

#[test]
fn function_definition_round_trips_through_json_and_reads_null_parameters_as_empty() {
    let definition = add_definition();
    let json = serde_json::to_value(&definition).unwrap();
    assert_eq!(json["func_name"], json!("add"));
    assert_eq!(serde_json::from_value::<FunctionDefinition>(json).unwrap(), definition);
    let bare: FunctionDefinition =
        serde_json::from_value(json!({"func_name": "ping", "func_parameters": null})).unwrap();
    assert_eq!(bare, FunctionDefinition::new("ping", None));
    assert!(serde_json::from_value::<FunctionDefinition>(json!({"func_desc": "x"})).is_err());
}

/// Arguments of the weather tool.
#[derive(schemars::JsonSchema)]
#[allow(dead_code)]
struct WeatherArgs {
    /// The city.
    city: String,
    /// Days ahead.
    days: Option<u8>,
}

#[test]
fn function_definition_from_schema_uses_the_json_schema_of_a_type() {
    let definition = FunctionDefinition::from_schema::<WeatherArgs>("get_weather", None);
    assert_eq!(definition.func_name, "get_weather");
    assert_eq!(definition.func_desc.as_deref(), Some("Arguments of the weather tool."));
    let parameters = &definition.func_parameters;
    assert_eq!(parameters["type"], json!("object"));
    assert_eq!(parameters["required"], json!(["city"]));
    assert_eq!(parameters["properties"]["city"]["type"], json!("string"));
    assert_eq!(parameters["properties"]["city"]["description"], json!("The city."));
    assert!(!parameters.contains_key("$schema"));
    assert!(!parameters.contains_key("title"));

    let described = FunctionDefinition::from_schema::<WeatherArgs>("get_weather", Some("Weather forecast."));
    assert_eq!(described.func_desc.as_deref(), Some("Weather forecast."));
}

#[test]
fn yaml_quotes_strings_that_would_read_as_something_else() {
    assert_eq!(to_yaml_string(&json!("plain text. ok")), "plain text. ok\n");
    assert_eq!(to_yaml_string(&json!("")), "\"\"\n");
    assert_eq!(to_yaml_string(&json!("true")), "\"true\"\n");
    assert_eq!(to_yaml_string(&json!("No")), "\"No\"\n");
    assert_eq!(to_yaml_string(&json!("null")), "\"null\"\n");
    assert_eq!(to_yaml_string(&json!("123")), "\"123\"\n");
    assert_eq!(to_yaml_string(&json!("a: b")), "\"a: b\"\n");
    assert_eq!(to_yaml_string(&json!("# note")), "\"# note\"\n");
    assert_eq!(to_yaml_string(&json!(" padded")), "\" padded\"\n");
    assert_eq!(to_yaml_string(&json!("trailing ")), "\"trailing \"\n");
    assert_eq!(to_yaml_string(&json!("two\nlines")), "\"two\\nlines\"\n");
    assert_eq!(to_yaml_string(&json!("- item")), "\"- item\"\n");
}

#[test]
fn yaml_writes_scalars_and_empty_containers_inline() {
    assert_eq!(to_yaml_string(&json!(null)), "null\n");
    assert_eq!(to_yaml_string(&json!(true)), "true\n");
    assert_eq!(to_yaml_string(&json!(-1.5)), "-1.5\n");
    assert_eq!(to_yaml_string(&json!({})), "{}\n");
    assert_eq!(to_yaml_string(&json!([])), "[]\n");
    assert_eq!(to_yaml_string(&json!({"a": [], "b": {}, "c": null})), "a: []\nb: {}\nc: null\n");
}

#[test]
fn yaml_nests_maps_and_sequences() {
    let value = json!({
        "items": [{"name": "x", "tags": ["t1", "t2"]}, [1, [2, 3]], "last"],
        "outer": {"inner": {"deep": 1}}
    });
    let expected = "\
items:
- name: x
  tags:
  - t1
  - t2
- - 1
  - - 2
    - 3
- last
outer:
  inner:
    deep: 1
";
    assert_eq!(to_yaml_string(&value), expected);
    assert_eq!(to_yaml_string(&json!(["a", {"k": "v"}])), "- a\n- k: v\n");
    assert_eq!(to_yaml_string(&json!({"weird key": 1, "x:y": 2})), "weird key: 1\n\"x:y\": 2\n");
}

// ---------------------------------------------------------------------------------------
// Functions.
// ---------------------------------------------------------------------------------------

#[test]
fn function_from_function_takes_the_name_of_a_fn_item() {
    let function =
        Function::from_function(&add, Some("Add two numbers"), vec![json!(1), json!(2)], Map::new()).unwrap();
    assert_eq!(function.name, "add");
    assert_eq!(function.thought.as_deref(), Some("Add two numbers"));
    assert_eq!(function.args, vec![json!(1), json!(2)]);
    assert!(function.kwargs.is_empty());
    assert_eq!(function.id, None);

    let method = Function::from_function(&Calculator::multiply, None, vec![], Map::new()).unwrap();
    assert_eq!(method.name, "multiply");
    assert_eq!(method.thought, None);
}

#[test]
fn function_name_strips_the_module_path_and_generic_arguments() {
    assert_eq!(function_name(&add), Ok("add"));
    assert_eq!(function_name(&identity::<Vec<Option<u8>>>), Ok("identity"));
    assert_eq!(function_name(&Calculator::multiply), Ok("multiply"));
    assert_eq!(function_name(&str::len), Ok("len"));
}

#[test]
fn function_from_function_refuses_closures_and_other_values() {
    let offset = 3;
    let closure = |a: i64| a + offset;
    assert!(matches!(
        Function::from_function(&closure, None, vec![], Map::new()),
        Err(FromFunctionError::Closure { type_name }) if type_name.contains("{{closure}}")
    ));
    let capture_free = |a: i64| a;
    assert!(matches!(function_name(&capture_free), Err(FromFunctionError::Closure { .. })));

    let pointer: fn(i64, i64) -> i64 = add;
    assert!(matches!(function_name(&pointer), Err(FromFunctionError::NotAFunctionItem { .. })));
    assert!(matches!(function_name(&5u32), Err(FromFunctionError::NotAFunctionItem { type_name: "u32" })));
    assert!(matches!(function_name(&()), Err(FromFunctionError::NotAFunctionItem { type_name: "()" })));
    assert!(matches!(
        FunctionExpression::from_function(&closure, None, vec![], Map::new()),
        Err(FromFunctionError::Closure { .. })
    ));
}

#[test]
fn function_builders_set_each_field() {
    let function = Function::new("search")
        .with_id("call_1")
        .with_thought("look it up")
        .with_args(vec![json!("rust")])
        .with_kwargs(object(json!({"limit": 5})));
    assert_eq!(function.id.as_deref(), Some("call_1"));
    assert_eq!(function.thought.as_deref(), Some("look it up"));
    assert_eq!(function.name, "search");
    assert_eq!(function.args, vec![json!("rust")]);
    assert_eq!(function.kwargs["limit"], json!(5));
    assert_eq!(function.is_answer_final, None);
    assert_eq!(function.answer, None);
}

#[test]
fn function_round_trips_through_json_with_adalflows_private_answer_fields() {
    let function = Function {
        is_answer_final: Some(true),
        answer: Some(json!("42")),
        ..Function::new("finish").with_id("c1").with_kwargs(object(json!({"answer": "42"})))
    };
    let json = serde_json::to_value(&function).unwrap();
    assert_eq!(
        json,
        json!({
            "id": "c1",
            "name": "finish",
            "args": [],
            "kwargs": {"answer": "42"},
            "_is_answer_final": true,
            "_answer": "42"
        })
    );
    assert_eq!(serde_json::from_value::<Function>(json).unwrap(), function);
}

#[test]
fn function_reads_null_or_missing_arguments_as_empty() {
    let function: Function =
        serde_json::from_value(json!({"name": "ping", "args": null, "kwargs": null})).unwrap();
    assert_eq!(function, Function::new("ping"));
    let nameless: Function = serde_json::from_value(json!({})).unwrap();
    assert_eq!(nameless.name, "", "AdalFlow's default name is empty");
    assert!(serde_json::from_value::<Function>(json!({"name": "x", "args": {"a": 1}})).is_err());
}

#[test]
fn function_parse_expression_is_the_parser() {
    let function = Function::parse_expression("add(1, b=2)").unwrap();
    assert_eq!(function, parse_function_call_expr("add(1, b=2)").unwrap());
    assert!(Function::parse_expression("add(").is_err());
}

#[test]
fn function_to_function_expression_writes_a_python_call_that_parses_back() {
    let function = Function::new("ns.tool")
        .with_thought("why")
        .with_args(vec![json!([1, 2]), json!({"k": true})])
        .with_kwargs(object(json!({"flag": null, "name": "it's"})));
    let expression = function.to_function_expression().unwrap();
    assert_eq!(expression.action, r#"ns.tool([1, 2], {'k': True}, flag=None, name="it's")"#);
    assert_eq!(expression.thought.as_deref(), Some("why"));
    assert_eq!(expression.to_function().unwrap(), function);
}

#[test]
fn function_to_function_expression_refuses_names_python_cannot_call() {
    for name in ["", "1abc", "my tool", "a..b", "def", "ns.class"] {
        assert_eq!(
            Function::new(name).to_function_expression(),
            Err(FromFunctionError::InvalidName { name: name.to_owned() }),
            "{name:?}"
        );
    }
    for key in ["my key", "None", "lambda", "2x", ""] {
        let mut kwargs = Map::new();
        kwargs.insert(key.to_owned(), json!(1));
        assert_eq!(
            Function::new("f").with_kwargs(kwargs).to_function_expression(),
            Err(FromFunctionError::InvalidKeyword { name: key.to_owned() }),
            "{key:?}"
        );
    }
}

// ---------------------------------------------------------------------------------------
// Function expressions.
// ---------------------------------------------------------------------------------------

#[test]
fn function_expression_from_function_writes_keyword_arguments() {
    let expression = FunctionExpression::from_function(
        &add,
        Some("Add two numbers"),
        vec![],
        object(json!({"a": 1, "b": 2})),
    )
    .unwrap();
    assert_eq!(expression, FunctionExpression::new("add(a=1, b=2)").with_thought("Add two numbers"));
}

#[test]
fn function_expression_from_function_writes_positional_then_keyword_arguments() {
    let positional =
        FunctionExpression::from_function(&add, None, vec![json!(1), json!(2)], Map::new()).unwrap();
    assert_eq!(positional.action, "add(1, 2)");
    assert_eq!(positional.thought, None);
    let mixed = FunctionExpression::from_function(
        &add,
        None,
        vec![json!("x")],
        object(json!({"b": 2.5, "c": [true]})),
    )
    .unwrap();
    assert_eq!(mixed.action, "add('x', b=2.5, c=[True])");
    let empty = FunctionExpression::from_function(&add, None, vec![], Map::new()).unwrap();
    assert_eq!(empty.action, "add()");
}

#[test]
fn to_python_literal_writes_values_as_python_repr_does() {
    assert_eq!(to_python_literal(&json!(null)), "None");
    assert_eq!(to_python_literal(&json!(true)), "True");
    assert_eq!(to_python_literal(&json!(false)), "False");
    assert_eq!(to_python_literal(&json!(-7)), "-7");
    assert_eq!(to_python_literal(&json!(u64::MAX)), "18446744073709551615");
    assert_eq!(to_python_literal(&json!(2.0)), "2.0");
    assert_eq!(to_python_literal(&json!(1e300)), "1e+300", "as Python writes it");
    assert_eq!(to_python_literal(&json!("plain")), "'plain'");
    assert_eq!(to_python_literal(&json!("it's")), r#""it's""#);
    assert_eq!(to_python_literal(&json!("both ' and \"")), r#"'both \' and "'"#);
    assert_eq!(to_python_literal(&json!("a\\b\n\t\r\u{7}\u{85}é")), r"'a\\b\n\t\r\x07\x85é'");
    assert_eq!(to_python_literal(&json!([1, "a", [null]])), "[1, 'a', [None]]");
    assert_eq!(to_python_literal(&json!({"k": {"n": 1}, "a": []})), "{'a': [], 'k': {'n': 1}}");
}

#[test]
fn function_expression_to_function_keeps_the_thought() {
    let expression = FunctionExpression::new("add(1, 2)").with_thought("sum");
    let function = expression.to_function().unwrap();
    assert_eq!(function.name, "add");
    assert_eq!(function.args, vec![json!(1), json!(2)]);
    assert_eq!(function.thought.as_deref(), Some("sum"));
    assert_eq!(FunctionExpression::new("add(1, 2)").to_function().unwrap().thought, None);
    assert!(FunctionExpression::new("add(1, 2").to_function().is_err());
}

#[test]
fn function_expression_round_trips_through_json_and_requires_an_action() {
    let expression = FunctionExpression::new("add(a=1)").with_thought("t");
    let json = serde_json::to_value(&expression).unwrap();
    assert_eq!(json, json!({"thought": "t", "action": "add(a=1)"}));
    assert_eq!(serde_json::from_value::<FunctionExpression>(json).unwrap(), expression);
    assert_eq!(serde_json::to_value(FunctionExpression::new("f()")).unwrap(), json!({"action": "f()"}));
    assert!(serde_json::from_value::<FunctionExpression>(json!({"thought": "t"})).is_err());
}

// ---------------------------------------------------------------------------------------
// The parser: what it reads.
// ---------------------------------------------------------------------------------------

#[test]
fn function_expression_parses_positional_arguments() {
    let function = parse("add(1, 2)");
    assert_eq!(function.name, "add");
    assert_eq!(function.args, vec![json!(1), json!(2)]);
    assert!(function.kwargs.is_empty());
    assert_eq!(function.id, None);
    assert_eq!(function.thought, None);
}

#[test]
fn function_expression_parses_keyword_and_positional_arguments() {
    let function = parse(r#"search("rust", query="rust", limit=5)"#);
    assert_eq!(function.name, "search");
    assert_eq!(function.args, vec![json!("rust")]);
    assert_eq!(function.kwargs, object(json!({"query": "rust", "limit": 5})));
}

#[test]
fn function_expression_parses_dotted_names_and_container_arguments() {
    let function = parse(r#"ns.tool([1, 2], {"k": True}, flag=None)"#);
    assert_eq!(function.name, "ns.tool");
    assert_eq!(function.args, vec![json!([1, 2]), json!({"k": true})]);
    assert_eq!(function.kwargs, object(json!({"flag": null})));
    assert_eq!(parse("a . b .c()").name, "a.b.c");
}

#[test]
fn function_expression_parses_calls_without_arguments_and_with_trailing_commas() {
    assert_eq!(parse("ping()"), Function::new("ping"));
    assert_eq!(parse("  ping (  )  "), Function::new("ping"));
    assert_eq!(parse("add(1, 2,)").args, vec![json!(1), json!(2)]);
    assert_eq!(parse("add(a=1,\n    b=2,\n)").kwargs, object(json!({"a": 1, "b": 2})));
    assert_eq!(parse("add(1, \\\n 2)").args, vec![json!(1), json!(2)], "line continuation");
}

#[test]
fn function_expression_parses_integers_of_every_size_and_sign() {
    assert_eq!(literal("0"), json!(0));
    assert_eq!(literal("00"), json!(0));
    assert_eq!(literal("42"), json!(42));
    assert_eq!(literal("-42"), json!(-42));
    assert_eq!(literal("- 42"), json!(-42));
    assert_eq!(literal("+42"), json!(42));
    assert_eq!(literal("-0"), json!(0));
    assert_eq!(literal("18446744073709551615"), json!(u64::MAX));
    assert_eq!(literal("-9223372036854775808"), json!(i64::MIN));
}

#[test]
fn function_expression_parses_floats() {
    assert_eq!(literal("1.5"), json!(1.5));
    assert_eq!(literal("-2.5e-3"), json!(-0.0025));
    assert_eq!(literal(".5"), json!(0.5));
    assert_eq!(literal("-.5"), json!(-0.5));
    assert_eq!(literal("1."), json!(1.0));
    assert_eq!(literal("1e3"), json!(1000.0));
    assert_eq!(literal("1E+3"), json!(1000.0));
    assert_eq!(literal("1.e2"), json!(100.0));
    assert!(literal("2.0").is_f64(), "a float stays a float");
    assert!(literal("2").is_u64());
}

#[test]
fn function_expression_parses_quoted_strings_with_escapes() {
    assert_eq!(literal("'single'"), json!("single"));
    assert_eq!(literal("\"double\""), json!("double"));
    assert_eq!(literal("''"), json!(""));
    assert_eq!(literal("\"\""), json!(""));
    assert_eq!(literal(r#"'it\'s'"#), json!("it's"));
    assert_eq!(literal(r#""say \"hi\"""#), json!("say \"hi\""));
    assert_eq!(literal(r#""'inner'""#), json!("'inner'"));
    assert_eq!(literal(r"'a\nb\tc\rd\\e'"), json!("a\nb\tc\rd\\e"));
    assert_eq!(literal(r"'\a\b\f\v\0'"), json!("\u{7}\u{8}\u{c}\u{b}\u{0}"));
    assert_eq!(literal(r"'\x41\u00e9\U0001F600'"), json!("Aé😀"));
    assert_eq!(literal(r"'\101\1012'"), json!("AA2"), "octal escapes take up to three digits");
    assert_eq!(literal(r"'\d\w'"), json!("\\d\\w"), "unknown escapes are kept");
    assert_eq!(literal("'line\\\ncontinued'"), json!("linecontinued"));
    assert_eq!(literal("'héllo wörld'"), json!("héllo wörld"));
}

#[test]
fn function_expression_parses_triple_quoted_raw_and_prefixed_strings() {
    assert_eq!(literal("'''multi\nline'''"), json!("multi\nline"));
    assert_eq!(literal(r#""""with "quotes" inside""""#), json!("with \"quotes\" inside"));
    assert_eq!(literal("'''a''b'''"), json!("a''b"));
    assert_eq!(literal(r"r'\d+\.\w'"), json!("\\d+\\.\\w"));
    assert_eq!(literal(r#"R"raw \" quote""#), json!("raw \\\" quote"));
    assert_eq!(literal("u'unicode'"), json!("unicode"));
}

#[test]
fn function_expression_parses_python_constants() {
    assert_eq!(literal("True"), json!(true));
    assert_eq!(literal("False"), json!(false));
    assert_eq!(literal("None"), json!(null));
}

#[test]
fn function_expression_parses_lists_tuples_and_dicts() {
    assert_eq!(literal("[]"), json!([]));
    assert_eq!(literal("[1, 'a', None, [2, [3]]]"), json!([1, "a", null, [2, [3]]]));
    assert_eq!(literal("[1, 2, ]"), json!([1, 2]));
    assert_eq!(literal("()"), json!([]));
    assert_eq!(literal("(1,)"), json!([1]));
    assert_eq!(literal("(1, 2)"), json!([1, 2]));
    assert_eq!(literal("(1)"), json!(1), "parentheses alone make no tuple");
    assert_eq!(literal("((1, 2), [3])"), json!([[1, 2], [3]]));
    assert_eq!(literal("{}"), json!({}));
    assert_eq!(
        literal("{'a': 1, \"b\": [True], 'c': {'d': None},}"),
        json!({"a": 1, "b": [true], "c": {"d": null}})
    );
    assert_eq!(literal("{'a': 1, 'a': 2}"), json!({"a": 2}), "the last duplicate key wins, as in Python");
}

// ---------------------------------------------------------------------------------------
// The parser: what it refuses.
// ---------------------------------------------------------------------------------------

#[test]
fn function_expression_refuses_empty_actions() {
    assert_eq!(parse_error(""), ParseActionError::Empty { offset: 0 });
    assert_eq!(parse_error("  \n "), ParseActionError::Empty { offset: 4 });
}

#[test]
fn function_expression_refuses_actions_that_are_not_calls() {
    assert_eq!(
        parse_error("(1)"),
        ParseActionError::UnexpectedChar { offset: 0, found: '(', expected: "a function name" }
    );
    assert_eq!(
        parse_error("add"),
        ParseActionError::UnexpectedEnd { offset: 3, expected: "`(` after the function name" }
    );
    assert_eq!(
        parse_error("add 1"),
        ParseActionError::UnexpectedChar { offset: 4, found: '1', expected: "`(` after the function name" }
    );
    assert_eq!(
        parse_error("ns.(1)"),
        ParseActionError::UnexpectedChar { offset: 3, found: '(', expected: "a name after `.`" }
    );
    assert_eq!(
        parse_error("42"),
        ParseActionError::UnexpectedChar { offset: 0, found: '4', expected: "a function name" }
    );
}

#[test]
fn function_expression_refuses_unclosed_calls_and_containers() {
    assert_eq!(parse_error("add(1"), ParseActionError::UnexpectedEnd { offset: 5, expected: "`,` or `)`" });
    assert_eq!(parse_error("add(1,"), ParseActionError::UnexpectedEnd { offset: 6, expected: "a value" });
    assert_eq!(parse_error("add(a="), ParseActionError::UnexpectedEnd { offset: 6, expected: "a value" });
    assert_eq!(parse_error("f([1, 2"), ParseActionError::UnexpectedEnd { offset: 7, expected: "`,` or `]`" });
    assert_eq!(parse_error("f((1, 2"), ParseActionError::UnexpectedEnd { offset: 7, expected: "`,` or `)`" });
    assert_eq!(
        parse_error("f({'a': 1"),
        ParseActionError::UnexpectedEnd { offset: 9, expected: "`,` or `}`" }
    );
    assert_eq!(
        parse_error("f({'a' 1})"),
        ParseActionError::UnexpectedChar { offset: 7, found: '1', expected: "`:`" }
    );
    assert_eq!(
        parse_error("f(1 2)"),
        ParseActionError::UnexpectedChar { offset: 4, found: '2', expected: "`,` or `)`" }
    );
    assert_eq!(
        parse_error("f(,)"),
        ParseActionError::UnexpectedChar { offset: 2, found: ',', expected: "a value" }
    );
    assert_eq!(
        parse_error("f(1,,)"),
        ParseActionError::UnexpectedChar { offset: 4, found: ',', expected: "a value" }
    );
}

#[test]
fn function_expression_refuses_input_after_the_call() {
    assert_eq!(parse_error("add(1) + 2"), ParseActionError::TrailingInput { offset: 7 });
    assert_eq!(parse_error("add(1)add(2)"), ParseActionError::TrailingInput { offset: 6 });
    assert_eq!(parse_error("add(1))"), ParseActionError::TrailingInput { offset: 6 });
}

#[test]
fn function_expression_refuses_unterminated_strings() {
    assert_eq!(parse_error("f('abc"), ParseActionError::UnterminatedString { offset: 2 });
    assert_eq!(parse_error("f(\"abc')"), ParseActionError::UnterminatedString { offset: 2 });
    assert_eq!(parse_error("f('a\nb')"), ParseActionError::UnterminatedString { offset: 2 });
    assert_eq!(parse_error("f('''abc'')"), ParseActionError::UnterminatedString { offset: 2 });
    assert_eq!(parse_error("f(r'abc\\"), ParseActionError::UnterminatedString { offset: 2 });
    assert_eq!(parse_error("f('abc\\"), ParseActionError::UnterminatedString { offset: 2 });
}

#[test]
fn function_expression_refuses_invalid_escapes() {
    assert_eq!(parse_error(r"f('\x4')"), ParseActionError::InvalidEscape { offset: 3 });
    assert_eq!(parse_error(r"f('ab\u12g4')"), ParseActionError::InvalidEscape { offset: 5 });
    assert_eq!(parse_error(r"f('\ud800')"), ParseActionError::InvalidEscape { offset: 3 }, "lone surrogate");
    assert_eq!(parse_error(r"f('\U00110000')"), ParseActionError::InvalidEscape { offset: 3 });
    assert_eq!(parse_error(r"f('\N{EM DASH}')"), ParseActionError::InvalidEscape { offset: 3 });
}

#[test]
fn function_expression_refuses_malformed_numbers() {
    for (action, text) in [
        ("f(007)", "007"),
        ("f(1e)", "1e"),
        ("f(0x1f)", "0x1f"),
        ("f(1_000)", "1_000"),
        ("f(1.2.3)", "1.2.3"),
        ("f(12abc)", "12abc"),
        ("f(-01)", "-01"),
    ] {
        assert_eq!(
            parse_error(action),
            ParseActionError::InvalidNumber { offset: 2, text: text.to_owned() },
            "{action}"
        );
    }
}

#[test]
fn function_expression_refuses_numbers_out_of_range() {
    assert_eq!(
        parse_error("f(18446744073709551616)"),
        ParseActionError::NumberOutOfRange { offset: 2, text: "18446744073709551616".to_owned() }
    );
    assert_eq!(
        parse_error("f(x=-9223372036854775809)"),
        ParseActionError::NumberOutOfRange { offset: 4, text: "-9223372036854775809".to_owned() }
    );
    assert_eq!(
        parse_error("f(1e999)"),
        ParseActionError::NumberOutOfRange { offset: 2, text: "1e999".to_owned() }
    );
}

#[test]
fn function_expression_refuses_signs_without_a_number() {
    assert_eq!(
        parse_error("f(-x)"),
        ParseActionError::UnexpectedChar { offset: 3, found: 'x', expected: "a number after the sign" }
    );
    assert_eq!(
        parse_error("f(--1)"),
        ParseActionError::UnexpectedChar { offset: 3, found: '-', expected: "a number after the sign" }
    );
    assert_eq!(
        parse_error("f(-"),
        ParseActionError::UnexpectedEnd { offset: 3, expected: "a number after the sign" }
    );
}

#[test]
fn function_expression_refuses_python_keywords_as_names() {
    assert_eq!(parse_error("def(1)"), ParseActionError::ReservedWord { offset: 0, word: "def".to_owned() });
    assert_eq!(
        parse_error("ns.class(1)"),
        ParseActionError::ReservedWord { offset: 3, word: "class".to_owned() }
    );
    assert_eq!(
        parse_error("f(None=1)"),
        ParseActionError::ReservedWord { offset: 2, word: "None".to_owned() }
    );
    assert_eq!(
        parse_error("f(a=1, if=2)"),
        ParseActionError::ReservedWord { offset: 7, word: "if".to_owned() }
    );
}

#[test]
fn function_expression_refuses_nested_calls() {
    assert_eq!(
        parse_error("add(1, mul(2, 3))"),
        ParseActionError::NestedCall { offset: 7, name: "mul".to_owned() }
    );
    assert_eq!(
        parse_error("f(x=math.sqrt (4))"),
        ParseActionError::NestedCall { offset: 4, name: "math.sqrt".to_owned() }
    );
    assert_eq!(
        parse_error("f([int(1)])"),
        ParseActionError::NestedCall { offset: 3, name: "int".to_owned() }
    );
}

#[test]
fn function_expression_refuses_variables_and_other_expressions() {
    assert_eq!(parse_error("f(x)"), ParseActionError::UnknownName { offset: 2, name: "x".to_owned() });
    assert_eq!(
        parse_error("f(math.pi)"),
        ParseActionError::UnknownName { offset: 2, name: "math.pi".to_owned() }
    );
    assert_eq!(parse_error("f(true)"), ParseActionError::UnknownName { offset: 2, name: "true".to_owned() });
    assert_eq!(parse_error("f(b'x')"), ParseActionError::UnknownName { offset: 2, name: "b".to_owned() });
    assert_eq!(
        parse_error("f(1 + 2)"),
        ParseActionError::UnexpectedChar { offset: 4, found: '+', expected: "`,` or `)`" }
    );
    assert_eq!(
        parse_error("f(*args)"),
        ParseActionError::UnexpectedChar { offset: 2, found: '*', expected: "a value" }
    );
    assert_eq!(parse_error("f(a==1)"), ParseActionError::UnknownName { offset: 2, name: "a".to_owned() });
    assert_eq!(
        parse_error("f('a' 'b')"),
        ParseActionError::UnexpectedChar { offset: 6, found: '\'', expected: "`,` or `)`" }
    );
}

#[test]
fn function_expression_refuses_positional_arguments_after_keyword_ones() {
    assert_eq!(parse_error("f(a=1, 2)"), ParseActionError::PositionalAfterKeyword { offset: 7 });
}

#[test]
fn function_expression_refuses_repeated_keyword_arguments() {
    assert_eq!(
        parse_error("f(a=1, b=2, a=3)"),
        ParseActionError::DuplicateKeyword { offset: 12, name: "a".to_owned() }
    );
}

#[test]
fn function_expression_refuses_sets_and_non_string_dict_keys() {
    assert_eq!(parse_error("f({1, 2})"), ParseActionError::SetNotSupported { offset: 2 });
    assert_eq!(parse_error("f({'a'})"), ParseActionError::SetNotSupported { offset: 2 });
    assert_eq!(parse_error("f({'a': 1, 2: 3})"), ParseActionError::NonStringKey { offset: 11 });
    assert_eq!(parse_error("f({(1, 2): 3})"), ParseActionError::NonStringKey { offset: 3 });
}

#[test]
fn function_expression_refuses_literals_nested_too_deeply() {
    let deep = format!("f({}{})", "[".repeat(MAX_LITERAL_DEPTH + 1), "]".repeat(MAX_LITERAL_DEPTH + 1));
    assert_eq!(
        parse_error(&deep),
        ParseActionError::TooDeep { offset: 2 + MAX_LITERAL_DEPTH, limit: MAX_LITERAL_DEPTH }
    );
    let at_limit = format!("f({}{})", "[".repeat(MAX_LITERAL_DEPTH), "]".repeat(MAX_LITERAL_DEPTH));
    assert_eq!(parse(&at_limit).args.len(), 1);
    let huge = format!("f({}", "(".repeat(100_000));
    assert!(matches!(parse_error(&huge), ParseActionError::TooDeep { .. }));
    let dicts = format!("f({}", "{'a': ".repeat(1000));
    assert!(matches!(parse_error(&dicts), ParseActionError::TooDeep { .. }));
}

#[test]
fn function_expression_errors_give_byte_offsets_past_multibyte_text() {
    // `f("é", x)`: é takes two bytes, so x is at byte 8.
    let error = parse_error("f(\"é\", x)");
    assert_eq!(error, ParseActionError::UnknownName { offset: 8, name: "x".to_owned() });
    assert_eq!(error.offset(), 8);
    let error = parse_error("ƒ(1) ?");
    assert_eq!(error, ParseActionError::TrailingInput { offset: 6 });
}

#[test]
fn parse_errors_report_their_offset_in_the_message() {
    let cases: Vec<(&str, usize, &str)> = vec![
        ("", 0, "the action is empty (byte 0)"),
        ("add", 3, "unexpected end of the action at byte 3: expected `(` after the function name"),
        ("f(*)", 2, "unexpected '*' at byte 2: expected a value"),
        ("f('a", 2, "unterminated string literal starting at byte 2"),
        (r"f('\x')", 3, "invalid escape sequence at byte 3"),
        ("f(01)", 2, "invalid number \"01\" at byte 2"),
        ("f(1e400)", 2, "number \"1e400\" at byte 2 is out of range"),
        ("for()", 0, "\"for\" at byte 0 is a Python keyword, not a name"),
        ("f(g())", 2, "nested call of \"g\" at byte 2: arguments must be literals"),
        ("f(y)", 2, "name \"y\" at byte 2 is not a literal"),
        ("f(a=1, 2)", 7, "positional argument at byte 7 follows a keyword argument"),
        ("f(a=1, a=1)", 7, "keyword argument \"a\" at byte 7 is repeated"),
        ("f({1: 2})", 3, "dict key at byte 3 is not a string"),
        ("f({1})", 2, "set literal at byte 2 is not supported"),
        ("f() x", 4, "unexpected input after the call at byte 4"),
    ];
    for (action, offset, message) in cases {
        let error = parse_error(action);
        assert_eq!(error.offset(), offset, "{action}");
        assert_eq!(error.to_string(), message, "{action}");
    }
    let deep = parse_error(&format!("f({})", "[".repeat(MAX_LITERAL_DEPTH + 1)));
    assert_eq!(deep.to_string(), format!("literals nest deeper than {MAX_LITERAL_DEPTH} levels at byte 66"));
}

// ---------------------------------------------------------------------------------------
// Property tests.
// ---------------------------------------------------------------------------------------

const PYTHON_KEYWORDS: [&str; 35] = [
    "False", "None", "True", "and", "as", "assert", "async", "await", "break", "class", "continue", "def",
    "del", "elif", "else", "except", "finally", "for", "from", "global", "if", "import", "in", "is",
    "lambda", "nonlocal", "not", "or", "pass", "raise", "return", "try", "while", "with", "yield",
];

fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<f64>().prop_filter("JSON numbers are finite", |f| f.is_finite()).prop_map(Value::from),
        any::<String>().prop_map(Value::String),
    ];
    leaf.prop_recursive(4, 48, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::btree_map(any::<String>(), inner, 0..6)
                .prop_map(|map| Value::Object(map.into_iter().collect())),
        ]
    })
}

fn keyword_name() -> impl Strategy<Value = String> {
    "[A-Za-z_][A-Za-z0-9_]{0,10}"
        .prop_filter("not a Python keyword", |name| !PYTHON_KEYWORDS.contains(&name.as_str()))
}

fn callable_name() -> impl Strategy<Value = String> {
    prop::collection::vec(keyword_name(), 1..4).prop_map(|parts| parts.join("."))
}

proptest! {
    #[test]
    fn parser_never_panics_on_arbitrary_strings(action in any::<String>()) {
        let _ = parse_function_call_expr(&action);
    }

    #[test]
    fn parser_never_panics_on_call_shaped_strings(
        action in r#"[a-z_.]{0,4}\(?[-+0-9a-zA-Z_.eExuUN'"\\ \n,:=()\[\]{}*é]{0,40}\)?"#
    ) {
        match parse_function_call_expr(&action) {
            Ok(function) => prop_assert!(!function.name.is_empty()),
            Err(error) => prop_assert!(error.offset() <= action.len()),
        }
    }

    #[test]
    fn from_function_output_parses_back_to_the_same_function(
        thought in proptest::option::of(any::<String>()),
        args in prop::collection::vec(json_value(), 0..5),
        kwargs in prop::collection::btree_map(keyword_name(), json_value(), 0..5),
    ) {
        let kwargs: Map<String, Value> = kwargs.into_iter().collect();
        let expression = FunctionExpression::from_function(&add, thought.as_deref(), args.clone(), kwargs.clone()).unwrap();
        let expected = Function::from_function(&add, thought.as_deref(), args, kwargs).unwrap();
        prop_assert_eq!(expression.to_function().unwrap(), expected);
    }

    #[test]
    fn function_expressions_of_any_call_parse_back_to_the_call(
        name in callable_name(),
        args in prop::collection::vec(json_value(), 0..4),
        kwargs in prop::collection::btree_map(keyword_name(), json_value(), 0..4),
    ) {
        let function = Function::new(name).with_args(args).with_kwargs(kwargs.into_iter().collect());
        let expression = function.to_function_expression().unwrap();
        prop_assert_eq!(parse_function_call_expr(&expression.action).unwrap(), function);
    }

    #[test]
    fn python_literals_parse_back_to_the_same_value(value in json_value()) {
        let action = format!("f({})", to_python_literal(&value));
        let function = parse_function_call_expr(&action).unwrap();
        prop_assert_eq!(function.args, vec![value]);
    }

    #[test]
    fn parse_errors_point_inside_the_action(prefix in "[a-z]{1,5}\\(", rest in any::<String>()) {
        let action = format!("{prefix}{rest}");
        if let Err(error) = parse_function_call_expr(&action) {
            prop_assert!(error.offset() <= action.len());
            prop_assert!(action.is_char_boundary(error.offset()));
        }
    }
}

// ---------------------------------------------------------------------------------------
// Function and tool outputs.
// ---------------------------------------------------------------------------------------

#[test]
fn function_output_success_is_named_after_its_call() {
    let output = FunctionOutput::success(Function::new("add").with_args(vec![json!(1), json!(2)]), json!(3));
    assert_eq!(output.name.as_deref(), Some("add"));
    assert_eq!(output.output, json!(3));
    assert_eq!(output.parsed_input, None);
    assert!(matches!(output.input, Some(FunctionInput::Function(ref f)) if f.name == "add"));
    assert!(output.is_success());
}

#[test]
fn function_output_parses_an_expression_input() {
    let output = FunctionOutput::success(FunctionExpression::new("add(1, 2)"), json!(3));
    assert_eq!(output.name.as_deref(), Some("add"));
    assert_eq!(output.parsed_input.as_ref().map(|f| f.args.clone()), Some(vec![json!(1), json!(2)]));

    let unparsable = FunctionOutput::failure(FunctionExpression::new("add(1, x)"), "x is not defined");
    assert_eq!(unparsable.name, None);
    assert_eq!(unparsable.parsed_input, None);
    assert_eq!(unparsable.error.as_deref(), Some("x is not defined"));
    assert_eq!(unparsable.output, Value::Null);
    assert!(!unparsable.is_success());
}

#[test]
fn function_output_round_trips_both_kinds_of_input_through_json() {
    let from_call = FunctionOutput::failure(Function::new("add"), "boom");
    let json = serde_json::to_value(&from_call).unwrap();
    assert_eq!(
        json,
        json!({"name": "add", "input": {"name": "add", "args": [], "kwargs": {}}, "error": "boom"})
    );
    assert_eq!(serde_json::from_value::<FunctionOutput>(json).unwrap(), from_call);

    let from_expression =
        FunctionOutput::success(FunctionExpression::new("add(1)").with_thought("t"), json!({"r": 1}));
    let json = serde_json::to_value(&from_expression).unwrap();
    assert_eq!(json["input"], json!({"thought": "t", "action": "add(1)"}));
    assert_eq!(json["parsed_input"]["name"], json!("add"));
    let back: FunctionOutput = serde_json::from_value(json).unwrap();
    assert!(matches!(back.input, Some(FunctionInput::Expression(_))));
    assert_eq!(back, from_expression);
    assert_eq!(serde_json::to_value(FunctionOutput::default()).unwrap(), json!({}));
}

#[test]
fn tool_output_constructors_set_the_status() {
    let success = ToolOutput::success(json!({"rows": 2})).with_observation("2 rows").with_display("Two rows");
    assert_eq!(success.status, ToolOutputStatus::Success);
    assert!(success.is_success());
    assert_eq!(success.output, json!({"rows": 2}));
    assert_eq!(success.observation.as_deref(), Some("2 rows"));
    assert_eq!(success.display.as_deref(), Some("Two rows"));
    assert!(!success.is_streaming);

    let error = ToolOutput::error("disk full");
    assert_eq!(error.status, ToolOutputStatus::Error);
    assert_eq!(error.observation.as_deref(), Some("disk full"));
    assert!(!error.is_success());

    let cancelled = ToolOutput::cancelled("user declined");
    assert_eq!(cancelled.status, ToolOutputStatus::Cancelled);
    assert_eq!(cancelled.observation.as_deref(), Some("user declined"));
    assert!(!cancelled.is_success());
}

#[test]
fn tool_output_round_trips_through_json_with_lowercase_statuses() {
    let output = ToolOutput {
        is_streaming: true,
        metadata: Some(object(json!({"ms": 12}))),
        ..ToolOutput::cancelled("stop")
    };
    let json = serde_json::to_value(&output).unwrap();
    assert_eq!(
        json,
        json!({"observation": "stop", "is_streaming": true, "metadata": {"ms": 12}, "status": "cancelled"})
    );
    assert_eq!(serde_json::from_value::<ToolOutput>(json).unwrap(), output);
    let minimal: ToolOutput = serde_json::from_value(json!({"output": 1, "is_streaming": null})).unwrap();
    assert_eq!(minimal, ToolOutput::success(json!(1)));
    assert_eq!(serde_json::to_value(ToolOutputStatus::Error).unwrap(), json!("error"));
    assert!(serde_json::from_value::<ToolOutput>(json!({"status": "failed"})).is_err());
}

#[test]
fn function_request_names_its_tool_and_gets_an_id() {
    let request =
        FunctionRequest::new(Function::new("delete_file").with_kwargs(object(json!({"path": "/tmp/x"}))));
    assert_eq!(request.tool_name.as_deref(), Some("delete_file"));
    assert!(uuid::Uuid::try_parse(&request.id).is_ok());
    assert_ne!(request.id, FunctionRequest::new(Function::new("x")).id);

    let json = serde_json::to_value(&request).unwrap();
    assert_eq!(serde_json::from_value::<FunctionRequest>(json).unwrap(), request);
    let without_id: FunctionRequest = serde_json::from_value(json!({"tool_name": "x"})).unwrap();
    assert!(uuid::Uuid::try_parse(&without_id.id).is_ok());
    assert_eq!(without_id.tool, None);
    assert_eq!(without_id.confirmation_details, None);
}

// ---------------------------------------------------------------------------------------
// Steps and runner results.
// ---------------------------------------------------------------------------------------

#[test]
fn step_output_prompt_str_shows_thought_action_and_observation_of_expressions() {
    let step = StepOutput {
        action: Some(FunctionExpression::new("add(1, 2)").with_thought("add them")),
        observation: Some("3".to_owned()),
        ..StepOutput::new(1)
    };
    assert_eq!(step.to_prompt_str(), r#"{"thought": "add them", "action": "add(1, 2)", "observation": "3"}"#);

    let no_thought = StepOutput { action: Some(FunctionExpression::new("f(\"q\")")), ..StepOutput::new(0) };
    assert_eq!(no_thought.to_prompt_str(), r#"{"action": "f(\"q\")"}"#);

    let empty_thought = StepOutput {
        action: Some(FunctionExpression::new("f()").with_thought("")),
        observation: Some(String::new()),
        ..StepOutput::new(0)
    };
    assert_eq!(empty_thought.to_prompt_str(), r#"{"action": "f()"}"#);
}

#[test]
fn step_output_prompt_str_shows_only_the_observation_of_other_actions() {
    let function_step: StepOutput = StepOutput {
        action: Some(Function::new("add")),
        observation: Some("line\nbreak".to_owned()),
        ..StepOutput::new(2)
    };
    assert_eq!(function_step.to_prompt_str(), r#"{"observation": "line\nbreak"}"#);
    let text_step: StepOutput<String> = StepOutput { action: Some("think".to_owned()), ..StepOutput::new(0) };
    assert_eq!(text_step.to_prompt_str(), "{}");
    let value_step: StepOutput<Value> = StepOutput {
        action: Some(json!({"action": "f()"})),
        observation: Some("ok".to_owned()),
        ..StepOutput::new(0)
    };
    assert_eq!(value_step.to_prompt_str(), r#"{"observation": "ok"}"#);
    assert_eq!(StepOutput::<FunctionExpression>::default().to_prompt_str(), "{}");
}

#[test]
fn step_output_round_trips_through_json() {
    let step: StepOutput = StepOutput {
        planner_prompt: Some("plan".to_owned()),
        action: Some(Function::new("add").with_args(vec![json!(1)])),
        function: Some(Function::new("add").with_args(vec![json!(1)])),
        observation: Some("1".to_owned()),
        ctx: Some(object(json!({"k": "v"}))),
        ..StepOutput::new(3)
    };
    let json = serde_json::to_value(&step).unwrap();
    assert_eq!(json["step"], json!(3));
    assert_eq!(json["action"]["name"], json!("add"));
    assert_eq!(serde_json::from_value::<StepOutput>(json).unwrap(), step);
    let empty: StepOutput = serde_json::from_value(json!({})).unwrap();
    assert_eq!(empty, StepOutput::default());
    assert_eq!(empty.step, 0);
}

#[test]
fn runner_result_reports_success_and_round_trips_through_json() {
    let mut result: RunnerResult = RunnerResult::default();
    assert!(result.is_success());
    assert!(result.step_history.is_empty());
    result.step_history.push(StepOutput::new(0));
    result.answer = Some("42".to_owned());
    let json = serde_json::to_value(&result).unwrap();
    assert_eq!(json, json!({"step_history": [{"step": 0}], "answer": "42"}));
    assert_eq!(serde_json::from_value::<RunnerResult>(json).unwrap(), result);

    let failed: RunnerResult = serde_json::from_value(json!({"error": "max steps"})).unwrap();
    assert!(!failed.is_success());
    assert!(failed.step_history.is_empty());
}

// ---------------------------------------------------------------------------------------
// Generator output.
// ---------------------------------------------------------------------------------------

const PNG_BYTES: &[u8] = b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR";
const JPEG_BYTES: &[u8] = &[0xFF, 0xD8, 0xFF, 0xE0, 0, 0x10];

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

#[test]
fn generator_output_success_and_failure_set_data_or_error() {
    let success = GeneratorOutput::success(json!({"answer": 1}));
    assert!(success.is_success());
    assert_eq!(success.data, Some(json!({"answer": 1})));
    let failure: GeneratorOutputType = GeneratorOutput::failure("parse error");
    assert!(!failure.is_success());
    assert_eq!(failure.data, None);
    assert_eq!(failure.error.as_deref(), Some("parse error"));
}

#[test]
fn generator_output_events_list_raw_chunks_before_falling_back_to_data() {
    let streamed = GeneratorOutput {
        raw_response: Some(json!([{"delta": "He"}, {"delta": "llo"}])),
        ..GeneratorOutput::success("Hello".to_owned())
    };
    assert_eq!(
        streamed.events(),
        vec![GeneratorEvent::Raw(&json!({"delta": "He"})), GeneratorEvent::Raw(&json!({"delta": "llo"}))]
    );

    let text = GeneratorOutput {
        raw_response: Some(json!("Hello")),
        ..GeneratorOutput::success("Hello".to_owned())
    };
    assert_eq!(text.events(), vec![GeneratorEvent::Data(&"Hello".to_owned())]);

    let consumed = GeneratorOutput { raw_response: Some(json!([])), ..GeneratorOutput::success(7) };
    assert_eq!(consumed.events(), vec![GeneratorEvent::Data(&7)]);
    assert!(GeneratorOutput::<i32>::failure("x").events().is_empty());
}

#[test]
fn generator_output_round_trips_through_json_with_one_or_many_images() {
    let output = GeneratorOutput {
        id: Some("g1".to_owned()),
        input: Some(json!("prompt")),
        thinking: Some("hmm".to_owned()),
        tool_use: Some(Function::new("draw")),
        images: Some(GeneratorImages::One("aGk=".to_owned())),
        usage: Some(CompletionUsage::new(3, 4)),
        raw_response: Some(json!("raw")),
        api_response: Some(json!({"id": "resp"})),
        metadata: Some(object(json!({"m": 1}))),
        ..GeneratorOutput::success(json!("done"))
    };
    let json = serde_json::to_value(&output).unwrap();
    assert_eq!(json["images"], json!("aGk="));
    assert_eq!(json["usage"]["total_tokens"], json!(7));
    assert_eq!(serde_json::from_value::<GeneratorOutput>(json).unwrap(), output);

    let many: GeneratorOutput = serde_json::from_value(json!({"images": ["a", "b"]})).unwrap();
    assert_eq!(many.images, Some(GeneratorImages::Many(vec!["a".to_owned(), "b".to_owned()])));
    assert_eq!(serde_json::to_value(GeneratorOutput::<Value>::default()).unwrap(), json!({}));
}

#[test]
fn generator_images_are_a_slice_of_one_or_many() {
    assert_eq!(GeneratorImages::One("a".to_owned()).as_slice(), ["a".to_owned()]);
    assert_eq!(GeneratorImages::Many(vec!["a".to_owned(), "b".to_owned()]).as_slice().len(), 2);
    assert!(GeneratorImages::Many(vec![]).as_slice().is_empty());
}

#[test]
fn decode_images_decodes_raw_base64_and_data_uris_with_their_format() {
    let output = GeneratorOutput::<Value> {
        images: Some(GeneratorImages::Many(vec![
            b64(PNG_BYTES),
            format!("data:image/jpeg;base64,{}", b64(JPEG_BYTES)),
            format!("data:image/webp;base64,{}", b64(b"not really webp")),
            b64(b"plain bytes"),
        ])),
        ..GeneratorOutput::default()
    };
    let images = output.decode_images().unwrap();
    assert_eq!(
        images,
        vec![
            DecodedImage { index: 0, format: Some(ImageFormat::Png), bytes: PNG_BYTES.to_vec() },
            DecodedImage { index: 1, format: Some(ImageFormat::Jpeg), bytes: JPEG_BYTES.to_vec() },
            DecodedImage { index: 2, format: Some(ImageFormat::Webp), bytes: b"not really webp".to_vec() },
            DecodedImage { index: 3, format: None, bytes: b"plain bytes".to_vec() },
        ]
    );
}

#[test]
fn decode_images_accepts_url_safe_unpadded_and_wrapped_base64() {
    let bytes: Vec<u8> = [PNG_BYTES, &[0xFB, 0xFF, 0xBF]].concat();
    let url_safe = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(&bytes);
    assert!(url_safe.contains('-') || url_safe.contains('_'));
    let standard = b64(&bytes);
    let wrapped = format!("  {}\n{}  ", &standard[..10], &standard[10..]);
    for image in [url_safe, wrapped] {
        let output = GeneratorOutput::<Value> {
            images: Some(GeneratorImages::One(image)),
            ..GeneratorOutput::default()
        };
        let decoded = output.decode_images().unwrap();
        assert_eq!(decoded[0].bytes, bytes);
        assert_eq!(decoded[0].format, Some(ImageFormat::Png));
    }
}

#[test]
fn decode_images_without_images_is_empty() {
    assert_eq!(GeneratorOutput::<Value>::default().decode_images(), Ok(vec![]));
}

#[test]
fn decode_images_refuses_urls_blank_and_malformed_images() {
    let decode = |image: &str| {
        GeneratorOutput::<Value> {
            images: Some(GeneratorImages::Many(vec![b64(PNG_BYTES), image.to_owned()])),
            ..GeneratorOutput::default()
        }
        .decode_images()
    };
    assert_eq!(decode("https://example.com/cat.png"), Err(ImageDecodeError::Url { index: 1 }));
    assert_eq!(decode("HTTP://example.com/cat.png"), Err(ImageDecodeError::Url { index: 1 }));
    assert_eq!(decode("   "), Err(ImageDecodeError::Empty { index: 1 }));
    assert_eq!(decode("not base64!"), Err(ImageDecodeError::InvalidBase64 { index: 1 }));
    assert_eq!(
        decode("data:image/png;base64,***"),
        Err(ImageDecodeError::InvalidDataUri { index: 1, source: DataUriError::InvalidBase64 })
    );
    assert_eq!(
        decode("data:image/png,plain"),
        Err(ImageDecodeError::InvalidDataUri { index: 1, source: DataUriError::NotBase64 })
    );
    let error = decode("data:png;base64,aGk=").unwrap_err();
    assert!(matches!(
        error,
        ImageDecodeError::InvalidDataUri { index: 1, source: DataUriError::InvalidMime(_) }
    ));
    assert!(error.to_string().starts_with("image 1 is an invalid data URI"));
    assert!(std::error::Error::source(&error).is_some());
}

#[test]
fn image_format_is_detected_from_magic_numbers_and_mime_types() {
    assert_eq!(ImageFormat::detect(PNG_BYTES), Some(ImageFormat::Png));
    assert_eq!(ImageFormat::detect(JPEG_BYTES), Some(ImageFormat::Jpeg));
    assert_eq!(ImageFormat::detect(b"GIF89a..."), Some(ImageFormat::Gif));
    assert_eq!(ImageFormat::detect(b"GIF87a..."), Some(ImageFormat::Gif));
    assert_eq!(ImageFormat::detect(b"RIFF\0\0\0\0WEBPVP8 "), Some(ImageFormat::Webp));
    assert_eq!(ImageFormat::detect(b"RIFF\0\0\0\0WAVE"), None);
    assert_eq!(ImageFormat::detect(b"RIFF"), None);
    assert_eq!(ImageFormat::detect(b"BM\0\0"), Some(ImageFormat::Bmp));
    assert_eq!(ImageFormat::detect(b""), None);
    assert_eq!(ImageFormat::from_mime("IMAGE/JPG"), Some(ImageFormat::Jpeg));
    assert_eq!(ImageFormat::from_mime("image/x-ms-bmp"), Some(ImageFormat::Bmp));
    assert_eq!(ImageFormat::from_mime("image/svg+xml"), None);
    for format in [ImageFormat::Png, ImageFormat::Jpeg, ImageFormat::Gif, ImageFormat::Webp, ImageFormat::Bmp]
    {
        assert_eq!(ImageFormat::from_mime(format.mime_type()), Some(format));
        assert!(format.mime_type().ends_with(format.extension()) || format == ImageFormat::Jpeg);
    }
    assert_eq!(ImageFormat::Jpeg.extension(), "jpg");
    assert_eq!(serde_json::to_value(ImageFormat::Webp).unwrap(), json!("webp"));
}

// ---------------------------------------------------------------------------------------
// Documents.
// ---------------------------------------------------------------------------------------

#[test]
fn document_new_gets_a_fresh_id() {
    let document =
        Document::new("Hello").with_meta_data(object(json!({"lang": "en"}))).with_vector(vec![0.1, 0.2]);
    assert_eq!(document.text, "Hello");
    assert_eq!(document.meta_data, Some(object(json!({"lang": "en"}))));
    assert_eq!(document.vector, vec![0.1, 0.2]);
    let id = document.id.clone().unwrap();
    assert!(uuid::Uuid::try_parse(&id).is_ok());
    assert_ne!(Document::new("Hello").id, document.id);
}

#[test]
fn document_from_dict_reads_adalflows_example() {
    let document =
        Document::from_dict(json!({"id": "123", "text": "Hello world", "meta_data": {"title": "Greeting"}}))
            .unwrap();
    assert_eq!(document.id.as_deref(), Some("123"));
    assert_eq!(document.text, "Hello world");
    assert_eq!(document.meta_data, Some(object(json!({"title": "Greeting"}))));
    assert!(document.vector.is_empty());
    assert_eq!(document.estimated_num_tokens, None);
}

#[test]
fn document_from_dict_gives_documents_without_an_id_a_new_one() {
    for doc in [json!({"text": "a"}), json!({"text": "a", "id": null}), json!({"text": "a", "id": ""})] {
        let document = Document::from_dict(doc).unwrap();
        assert!(uuid::Uuid::try_parse(document.id.as_deref().unwrap()).is_ok());
    }
}

#[test]
fn document_from_dict_refuses_what_is_not_a_document() {
    assert_eq!(Document::from_dict(json!(["text"])), Err(DocumentError::NotAnObject));
    assert_eq!(
        Document::from_dict(json!({"meta_data": {}})),
        Err(DocumentError::MissingField { field: "text" })
    );
    let error = Document::from_dict(json!({"text": 5})).unwrap_err();
    assert!(matches!(error, DocumentError::InvalidField { ref message } if message.contains("string")));
    assert!(matches!(
        Document::from_dict(json!({"text": "a", "id": 7})),
        Err(DocumentError::InvalidField { .. })
    ));
    assert!(matches!(
        Document::from_dict(json!({"text": "a", "vector": ["x"]})),
        Err(DocumentError::InvalidField { .. })
    ));
}

#[test]
fn document_round_trips_through_json_even_without_an_id() {
    let document = Document {
        order: Some(2),
        score: Some(0.75),
        parent_doc_id: Some("parent".to_owned()),
        estimated_num_tokens: Some(3),
        ..Document::new("chunk").with_vector(vec![0.5])
    };
    let json = serde_json::to_value(&document).unwrap();
    assert_eq!(json["parent_doc_id"], json!("parent"));
    assert_eq!(serde_json::from_value::<Document>(json).unwrap(), document);

    let anonymous = Document { id: None, ..Document::new("x") };
    let json = serde_json::to_value(&anonymous).unwrap();
    assert_eq!(json, json!({"text": "x", "id": null}));
    assert_eq!(serde_json::from_value::<Document>(json).unwrap(), anonymous);
    let missing_id: Document = serde_json::from_value(json!({"text": "x"})).unwrap();
    assert!(missing_id.id.is_some());
}

#[test]
fn generated_defaults_stay_out_of_json_schemas() {
    let document = serde_json::to_string(&schemars::schema_for!(Document)).unwrap();
    assert_eq!(document, serde_json::to_string(&schemars::schema_for!(Document)).unwrap());
    let conversation = serde_json::to_value(schemars::schema_for!(Conversation)).unwrap();
    assert!(conversation["properties"]["id"].get("default").is_none());
    assert!(conversation["properties"]["created_at"].get("default").is_none());
    let retriever = serde_json::to_value(schemars::schema_for!(RetrieverOutput)).unwrap();
    assert_eq!(retriever["required"], json!(["doc_indices"]));
    let generator = serde_json::to_value(schemars::schema_for!(GeneratorOutput)).unwrap();
    assert!(generator["properties"].get("images").is_some());
}

// ---------------------------------------------------------------------------------------
// Dialog turns and conversations.
// ---------------------------------------------------------------------------------------

#[test]
fn user_query_and_assistant_response_round_trip_through_json() {
    let query =
        UserQuery { metadata: Some(object(json!({"file": "a.txt"}))), ..UserQuery::new("Hi, how are you?") };
    let json = serde_json::to_value(&query).unwrap();
    assert_eq!(json, json!({"query_str": "Hi, how are you?", "metadata": {"file": "a.txt"}}));
    assert_eq!(serde_json::from_value::<UserQuery>(json).unwrap(), query);

    let response = AssistantResponse::new("Doing great!");
    let json = serde_json::to_value(&response).unwrap();
    assert_eq!(json, json!({"response_str": "Doing great!"}));
    assert_eq!(serde_json::from_value::<AssistantResponse>(json).unwrap(), response);
}

#[test]
fn dialog_turn_new_has_an_id_and_no_timestamps() {
    let turn = DialogTurn::new();
    assert!(uuid::Uuid::try_parse(&turn.id).is_ok());
    assert_eq!(turn.order, None);
    assert_eq!(turn.user_query, None);
    assert_eq!(turn.user_query_timestamp, None);
    assert_eq!(turn.assistant_response_timestamp, None);
    assert_ne!(DialogTurn::default().id, turn.id);
}

#[test]
fn dialog_turn_setters_keep_a_given_timestamp() {
    let asked = Timestamp::from_unix_millis(1_700_000_000_000);
    let answered = Timestamp::from_unix_millis(1_700_000_005_000);
    let mut turn = DialogTurn::new();
    turn.set_user_query(UserQuery::new("Hi"), Some(asked));
    turn.set_assistant_response(AssistantResponse::new("Hello"), Some(answered));
    assert_eq!(turn.user_query, Some(UserQuery::new("Hi")));
    assert_eq!(turn.user_query_timestamp, Some(asked));
    assert_eq!(turn.assistant_response, Some(AssistantResponse::new("Hello")));
    assert_eq!(turn.assistant_response_timestamp, Some(answered));
}

#[test]
fn dialog_turn_setters_stamp_now_without_a_timestamp() {
    let before = Timestamp::now();
    let mut turn = DialogTurn::new();
    turn.set_user_query(UserQuery::new("Hi"), None);
    turn.set_assistant_response(AssistantResponse::new("Hello"), None);
    let after = Timestamp::now();
    let asked = turn.user_query_timestamp.unwrap();
    let answered = turn.assistant_response_timestamp.unwrap();
    assert!(before <= asked && asked <= after);
    assert!(asked <= answered && answered <= after);

    let exchange = DialogTurn::from_exchange(UserQuery::new("Q"), AssistantResponse::new("A"));
    assert_eq!(exchange.user_query.map(|q| q.query_str).as_deref(), Some("Q"));
    assert_eq!(exchange.assistant_response.map(|r| r.response_str).as_deref(), Some("A"));
    assert!(exchange.user_query_timestamp.is_some() && exchange.assistant_response_timestamp.is_some());
}

#[test]
fn dialog_turn_round_trips_through_json() {
    let mut turn =
        DialogTurn { user_id: Some("u1".to_owned()), vector: Some(vec![0.5]), ..DialogTurn::new() };
    turn.set_user_query(UserQuery::new("Hi"), Some(Timestamp::from_unix_millis(1_000)));
    let json = serde_json::to_value(&turn).unwrap();
    assert_eq!(json["user_query_timestamp"], json!("1970-01-01T00:00:01.000000Z"));
    assert_eq!(json["user_query"], json!({"query_str": "Hi"}));
    assert_eq!(serde_json::from_value::<DialogTurn>(json).unwrap(), turn);
    let bare: DialogTurn = serde_json::from_value(json!({})).unwrap();
    assert!(uuid::Uuid::try_parse(&bare.id).is_ok());
}

fn exchange(query: &str, response: &str) -> DialogTurn {
    let mut turn = DialogTurn::new();
    turn.set_user_query(UserQuery::new(query), Some(Timestamp::from_unix_millis(0)));
    turn.set_assistant_response(AssistantResponse::new(response), Some(Timestamp::from_unix_millis(1)));
    turn
}

#[test]
fn conversation_appends_turns_at_the_next_order() {
    let mut conversation = Conversation::new();
    assert!(uuid::Uuid::try_parse(&conversation.id).is_ok());
    assert!(conversation.created_at.is_some());
    assert_eq!(conversation.get_next_order(), 0);
    assert_eq!(conversation.append_dialog_turn(exchange("Hi", "Hello")), Ok(0));
    assert_eq!(conversation.get_next_order(), 1);
    let numbered = DialogTurn { order: Some(1), ..exchange("How are you?", "Great") };
    assert_eq!(conversation.append_dialog_turn(numbered), Ok(1));
    let orders: Vec<usize> = conversation.get_dialog_turns().keys().copied().collect();
    assert_eq!(orders, vec![0, 1]);
    assert_eq!(conversation.get_dialog_turns()[&0].order, Some(0), "the order is written into the turn");
}

#[test]
fn conversation_refuses_to_append_a_turn_with_another_order() {
    let mut conversation = Conversation::new();
    let misplaced = DialogTurn { order: Some(5), ..exchange("Hi", "Hello") };
    assert_eq!(
        conversation.append_dialog_turn(misplaced),
        Err(ConversationError::OrderMismatch { expected: 0, found: 5 })
    );
    assert!(conversation.get_dialog_turns().is_empty());
}

#[test]
fn conversation_from_dialog_turns_appends_them_in_order() {
    let conversation = Conversation::from_dialog_turns(vec![exchange("a", "b"), exchange("c", "d")]).unwrap();
    assert_eq!(conversation.get_dialog_turns().len(), 2);
    assert_eq!(
        conversation.get_dialog_turns()[&1].user_query.as_ref().map(|q| q.query_str.as_str()),
        Some("c")
    );
    let error = Conversation::from_dialog_turns(vec![DialogTurn { order: Some(1), ..DialogTurn::new() }])
        .unwrap_err();
    assert_eq!(error, ConversationError::OrderMismatch { expected: 0, found: 1 });
    assert_eq!(error.to_string(), "the dialog turn has order 1, expected 0");
}

#[test]
fn conversation_chat_history_lists_user_and_assistant_lines_in_order() {
    let mut conversation =
        Conversation::from_dialog_turns(vec![exchange("Hi", "Hello"), exchange("Bye", "See you")]).unwrap();
    assert_eq!(
        conversation.get_chat_history_str(),
        "User: Hi\nAssistant: Hello\nUser: Bye\nAssistant: See you\n"
    );
    let mut pending = DialogTurn::new();
    pending.set_user_query(UserQuery::new("Still there?"), None);
    conversation.append_dialog_turn(pending).unwrap();
    assert!(conversation.get_chat_history_str().ends_with("Assistant: See you\nUser: Still there?\n"));
    assert_eq!(Conversation::new().get_chat_history_str(), "");
}

#[test]
fn conversation_deletes_turns_by_order() {
    let mut conversation =
        Conversation::from_dialog_turns(vec![exchange("a", "1"), exchange("b", "2"), exchange("c", "3")])
            .unwrap();
    let deleted = conversation.delete_dialog_turn(1).unwrap();
    assert_eq!(deleted.user_query.map(|q| q.query_str).as_deref(), Some("b"));
    assert_eq!(conversation.get_dialog_turns().keys().copied().collect::<Vec<_>>(), vec![0, 2]);
    assert_eq!(conversation.delete_dialog_turn(1), Err(ConversationError::UnknownOrder { order: 1 }));
    assert_eq!(conversation.get_next_order(), 3, "a deleted middle turn does not free the last order");
    assert_eq!(conversation.append_dialog_turn(exchange("d", "4")), Ok(3));
    assert_eq!(conversation.get_dialog_turns().len(), 3);
    assert_eq!(ConversationError::UnknownOrder { order: 9 }.to_string(), "no dialog turn has order 9");
}

#[test]
fn conversation_updates_existing_turns_only() {
    let mut conversation =
        Conversation::from_dialog_turns(vec![exchange("a", "1"), exchange("b", "2")]).unwrap();
    let old = conversation.update_dialog_turn(1, exchange("b", "two")).unwrap();
    assert_eq!(old.assistant_response.map(|r| r.response_str).as_deref(), Some("2"));
    let current = &conversation.get_dialog_turns()[&1];
    assert_eq!(current.assistant_response.as_ref().map(|r| r.response_str.as_str()), Some("two"));
    assert_eq!(current.order, Some(1));

    assert_eq!(
        conversation.update_dialog_turn(7, exchange("x", "y")),
        Err(ConversationError::UnknownOrder { order: 7 })
    );
    assert_eq!(
        conversation.update_dialog_turn(0, DialogTurn { order: Some(1), ..exchange("x", "y") }),
        Err(ConversationError::OrderMismatch { expected: 0, found: 1 })
    );
    assert_eq!(
        conversation.get_dialog_turns()[&0].user_query.as_ref().map(|q| q.query_str.as_str()),
        Some("a")
    );
    assert!(conversation.update_dialog_turn(0, DialogTurn { order: Some(0), ..exchange("x", "y") }).is_ok());
}

#[test]
fn conversation_round_trips_through_json_with_orders_as_keys() {
    let mut conversation = Conversation {
        name: Some("chat".to_owned()),
        user_id: Some("u1".to_owned()),
        metadata: Some(object(json!({"topic": "greetings"}))),
        ..Conversation::from_dialog_turns(vec![exchange("a", "1"), exchange("b", "2")]).unwrap()
    };
    conversation.created_at = Some(Timestamp::from_unix_millis(5_000));
    let json = serde_json::to_value(&conversation).unwrap();
    let keys: Vec<&String> = json["dialog_turns"].as_object().unwrap().keys().collect();
    assert_eq!(keys, ["0", "1"]);
    assert_eq!(json["created_at"], json!("1970-01-01T00:00:05.000000Z"));
    assert_eq!(serde_json::from_value::<Conversation>(json).unwrap(), conversation);

    let bare: Conversation = serde_json::from_value(json!({"dialog_turns": null})).unwrap();
    assert!(bare.dialog_turns.is_empty());
    assert!(bare.created_at.is_some(), "a missing created_at is now");
    let no_date: Conversation = serde_json::from_value(json!({"created_at": null})).unwrap();
    assert_eq!(no_date.created_at, None);
    assert!(serde_json::from_value::<Conversation>(json!({"dialog_turns": {"x": {}}})).is_err());
    assert_eq!(Conversation::default().get_next_order(), 0);
}
