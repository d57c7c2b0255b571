//! The Prometheus source's parsing, query plan and fold, without a server.

use super::answer::{Labels, REMEMBERED_ENTRY_BYTES, Wanted, read_series, sample_value};
use super::query::BY;
use super::*;
use crate::json_split::Splitter;
use reclaimer_core::gpu::signals::NAMES;
use serde::Deserialize;

/// A series as the tests keep it: its labels (owned: a `Series` borrows from the answer)
/// and its values.
struct Kept {
    labels: Vec<(String, String)>,
    values: Vec<(f64, Option<f64>)>,
}

/// A series as serde_json reads it (the reference `read_series` is checked against): the
/// value of a point is a string Prometheus writes, or a number; `None` when not a number.
#[derive(Deserialize)]
struct SerdeSeries<'a> {
    #[serde(default, borrow)]
    metric: Labels<'a>,
    #[serde(default)]
    values: Vec<(f64, SerdeValue)>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum SerdeValue {
    Number(f64),
    Text(String),
}

fn serde_series(bytes: &[u8]) -> Result<SerdeSeries<'_>, serde_json::Error> {
    serde_json::from_slice(bytes)
}

impl Kept {
    fn get(&self, name: &str) -> Option<&str> {
        self.labels.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
    }
}

fn read(status: u16, body: &str) -> (Result<(), String>, Vec<Kept>) {
    let mut got = Vec::new();
    let result = read_answer(status, body.as_bytes(), &mut |s| {
        let labels = s.metric.0.iter().map(|(k, v)| (k.0.to_string(), v.0.to_string())).collect();
        got.push(Kept { labels, values: s.values });
    });
    (result, got)
}

#[test]
fn hands_on_each_series_of_a_matrix() {
    // As Prometheus 2.42 writes it (`warnings` only when there are some).
    let body = r#"{"status":"success","data":{"resultType":"matrix","result":[
        {"metric":{"UUID":"GPU-1","exported_pod":"p"},"values":[[1700000040,"0.5"],[1700000100,"NaN"],[1700000160,"+Inf"]]},
        {"metric":{"pod":"esc\u0061ped\n"},"values":[[1700000040.5,"x"]]}]},"warnings":["a remote store was slow"]}"#;
    let (result, series) = read(200, body);
    assert_eq!(result, Ok(()));
    assert_eq!(series.len(), 2);
    assert_eq!((series[0].get("UUID"), series[0].get("exported_pod"), series[0].get("pod")), (Some("GPU-1"), Some("p"), None));
    let values = &series[0].values;
    assert_eq!(values[0], (1_700_000_040.0, Some(0.5)));
    assert!(values[1].1.is_some_and(f64::is_nan) && values[2].1 == Some(f64::INFINITY));
    assert_eq!(series[1].values[0].1, None, "not a number: no value");
    assert_eq!(series[1].get("pod"), Some("escaped\n"), "a label with escapes is unescaped");
}

fn fold(remember_budget: usize) -> Fold {
    Fold {
        source: Arc::from("p"),
        ownership: Ownership::default(),
        steps: 1,
        index: DigestMap::default(),
        series: Vec::new(),
        max_series: 10,
        over: false,
        per_pod: PerPod::default(),
        instances: reclaimer_core::ids::IdMap::default(),
        wanted: None,
        unlisted: Vec::new(),
        step_secs: 1,
        slice: (0, i64::MAX),
        slice_times: Vec::new(),
        points_left: usize::MAX,
        device_points_left: usize::MAX,
        device_series: 0,
        span: (0, i64::MAX),
        memo: LabelMemo::new(remember_budget),
    }
}

/// An answer as the service reads it (`SeriesInto` behind the splitter, most series read
/// where they begin in a chunk) in chunks of any size folds as it does read whole.
#[test]
fn an_answer_in_chunks_of_any_size_folds_as_it_does_whole() {
    let body = r#"{"status":"success","data":{"resultType":"matrix","result":[
        {"metric":{"UUID":"GPU-1","Hostname":"n1"},"values":[[60,"0.5"],[120,"1"]]},
        {"metric":{"UUID":"GPU-2","pod":"esc\u0061ped"},"values":[[60,"NaN"],[120,"0.25"]]},
        {"metric":{"UUID":"GPU-1","Hostname":"n1"},"values":[[180,"0"]]}]}}"#;
    // A per-process field: the only ones a series of no workspace pod is held for.
    let spec = QuerySpec { name: "DCGM_FI_DEV_GPU_UTIL" };
    let folded = |chunk: usize, budget: usize| {
        let fold = Mutex::new(fold(budget));
        let mut into = SeriesInto { status: 200, spec, fold: &fold, points: Vec::new() };
        let mut splitter = Splitter::new(RESULT, 1 << 20);
        for piece in body.as_bytes().chunks(chunk) {
            splitter.feed(piece, &mut into).unwrap();
        }
        check_envelope(200, &splitter.finish().unwrap()).unwrap();
        let fold = fold.into_inner().unwrap();
        format!("{:?}", fold.series)
    };
    let whole = folded(body.len(), 0);
    assert!(whole.contains("GPU-2") && whole.contains("00:03:00"), "every series and step is folded: {whole}");
    for chunk in 1..body.len() {
        for budget in [0, 1 << 20] {
            assert_eq!(folded(chunk, budget), whole, "chunks of {chunk}, memo budget {budget}");
        }
    }
}

#[test]
fn a_fetch_remembers_label_sets_within_its_byte_budget() {
    let mut fold = fold(2 * REMEMBERED_ENTRY_BYTES);
    // A per-process field: the only ones a series of no workspace pod is held for.
    let spec = QuerySpec { name: "DCGM_FI_DEV_GPU_UTIL" };
    let labels = |gpu: usize| format!(r#"{{"UUID":"GPU-{gpu}","pad":"{}"}}"#, "x".repeat(500));
    for gpu in 0..3 {
        fold.add_read(spec, labels(gpu).as_bytes(), &[(60.0, Some(0.5))]).unwrap();
    }
    assert_eq!(fold.series.len(), 3, "every GPU is read");
    assert_eq!(fold.memo.len(), 2, "only as many sets as the budget pays for are remembered, whatever their length");
    // A remembered set finds its GPU without being parsed again; the others still map.
    fold.add_read(spec, labels(0).as_bytes(), &[(120.0, Some(0.5))]).unwrap();
    fold.add_read(spec, labels(2).as_bytes(), &[(120.0, Some(0.5))]).unwrap();
    assert_eq!((fold.series.len(), fold.series[0].points.len(), fold.series[2].points.len()), (3, 2, 2));
}

/// The fields of a fetch are folded as their answers come, in any order. A device's series
/// (no workload pod) is held only for the per-process fields: read first for another field, its
/// set is not remembered as naming nothing, and the per-process field still holds it.
#[test]
fn a_device_series_met_first_in_another_field_is_held_for_a_per_process_one() {
    let mut fold = fold(1 << 20);
    let device = br#"{"UUID":"GPU-1","Hostname":"n1"}"#;
    fold.add_read(QuerySpec { name: "DCGM_FI_PROF_SM_ACTIVE" }, device, &[(60.0, Some(0.0))]).unwrap();
    assert!(fold.series.is_empty(), "not held for a field that is not per process");
    fold.add_read(QuerySpec { name: "DCGM_FI_DEV_GPU_UTIL" }, device, &[(60.0, Some(50.0))]).unwrap();
    assert_eq!(fold.series.len(), 1, "held for the per-process field read after it");
    assert_eq!(fold.series[0].points[0].values.get(reclaimer_core::gpu::signals::Signal::GpuUtil), Some(0.5));
    // Once held, still for the per-process fields only, in whatever order the fields come.
    fold.add_read(QuerySpec { name: "DCGM_FI_PROF_SM_ACTIVE" }, device, &[(60.0, Some(0.25))]).unwrap();
    assert_eq!(fold.series[0].points[0].values.get(reclaimer_core::gpu::signals::Signal::SmActive), None);
}

#[test]
fn a_series_is_read_as_serde_json_reads_it() {
    let elements = [
        r#"{"metric":{"UUID":"GPU-1","exported_pod":"p"},"values":[[1700000040,"0.5"],[1700000100,"NaN"],[1700000160,"+Inf"]]}"#,
        r#"{"values":[[1700000040.5,"x"], [1700000100, 7]], "metric":{"pod":"esc\u0061ped\n"}, "extra": {"a": [1]}}"#,
        r#"{"metric":{}}"#,
    ];
    for element in elements {
        let parsed = serde_series(element.as_bytes()).unwrap();
        let mut points = Vec::new();
        let metric = read_series(200, element.as_bytes(), &mut points).unwrap();
        let labels: Labels<'_> = serde_json::from_slice(metric).unwrap();
        let pairs = |l: &Labels<'_>| l.0.iter().map(|(k, v)| (k.0.to_string(), v.0.to_string())).collect::<Vec<_>>();
        assert_eq!(pairs(&labels), pairs(&parsed.metric), "{element}");
        let want: Vec<(f64, Option<f64>)> = parsed
            .values
            .iter()
            .map(|(t, v)| match v {
                SerdeValue::Number(n) => (*t, Some(*n)),
                SerdeValue::Text(text) => (*t, text.parse().ok()),
            })
            .collect();
        assert_eq!(format!("{points:?}"), format!("{want:?}"), "{element}");
    }
    for text in ["0", "7", "24.3", "NaN", "+Inf", "-1", "1e3", "x", "", "09"] {
        let want: Option<f64> = text.parse().ok();
        assert_eq!(format!("{:?}", sample_value(text)), format!("{want:?}"), "{text}");
    }
    for bad in [
        r#"{"metric":{},"values":[[1]]}"#,
        r#"{"metric":{},"values":[[1,"2",3]]}"#,
        r#"{"metric":{},"values":[[null,"2"]]}"#,
        r#"{"metric":{},"values":[["1","2"]]}"#,
        r#"{"metric":{},"metric":{}}"#,
        r#"{"metric":{},"values":[[1,"2"]]"#,
        r#"{"metric":{},"values":[[NaN,"2"]]}"#,
    ] {
        assert!(read_series(200, bad.as_bytes(), &mut Vec::new()).is_err(), "{bad}");
        assert!(serde_series(bad.as_bytes()).is_err(), "{bad}: serde_json refuses it too");
    }
}

#[test]
fn says_what_went_wrong() {
    let error = r#"{"status":"error","errorType":"execution","error":"query processing would load too many samples into memory"}"#;
    assert_eq!(read(422, error).0, Err("HTTP 422: execution query processing would load too many samples into memory".into()));
    assert_eq!(read(502, "<html>Bad Gateway</html>").0, Err("HTTP 502: not a Prometheus API response".into()));
    let success = r#"{"status":"success","data":{"resultType":"matrix","result":[]}}"#;
    assert_eq!(read(503, success).0, Err("HTTP 503".into()), "a success envelope under an error status is no answer");
    let vector = r#"{"status":"success","data":{"resultType":"vector","result":[{"metric":{},"value":[1,"1"]}]}}"#;
    assert_eq!(read(200, vector).0, Err("expected a matrix, got vector".into()));
    assert_eq!(read(200, r#"{"status":"success"}"#).0, Err("success without data".into()));
    let (cut, _) = read(200, &success[..success.len() - 3]);
    assert!(cut.is_err(), "a body cut short is no answer");
    assert!(read(200, &format!("{success} trailing")).0.is_err());
}

#[test]
fn a_whole_window_is_asked_as_stored_and_new_steps_aggregated() {
    let spec = QuerySpec { name: "DCGM_FI_PROF_SM_ACTIVE" };
    let f = |namespace, workspace_label, selector| Filters { namespace, workspace_label, selector, jobs: &[] };
    assert_eq!(spec.promql(60, f(None, None, None), false), "max_over_time(DCGM_FI_PROF_SM_ACTIVE{}[60s])");
    assert_eq!(
        spec.promql(60, f(Some("co\"der"), Some("label_ws"), None), true),
        format!(
            "max by ({by}, label_ws) (max_over_time(DCGM_FI_PROF_SM_ACTIVE{{exported_namespace=\"co\\\"der\"}}[60s])) or \
             max by ({by}, label_ws) (max_over_time(DCGM_FI_PROF_SM_ACTIVE{{pod_namespace=\"co\\\"der\"}}[60s])) or \
             max by ({by}, label_ws) (max_over_time(DCGM_FI_PROF_SM_ACTIVE{{namespace=\"co\\\"der\"}}[60s]))",
            by = BY.join(", ")
        )
    );
    let util = QuerySpec { name: "DCGM_FI_DEV_GPU_UTIL" };
    assert!(
        util.promql(60, f(Some("coder"), None, None), false)
            .ends_with(" or max_over_time(DCGM_FI_DEV_GPU_UTIL{exported_namespace=\"\",pod_namespace=\"\"}[60s])"),
        "the device-level series of a per-process field has no workload namespace"
    );
    // The selector narrows every query, beside the namespace filter.
    let job = Some("job=\"nvidia-dcgm-exporter\"");
    assert_eq!(spec.promql(60, f(None, None, job), false), "max_over_time(DCGM_FI_PROF_SM_ACTIVE{job=\"nvidia-dcgm-exporter\"}[60s])");
    assert!(
        util.promql(60, f(Some("coder"), None, job), false).ends_with(
            " or max_over_time(DCGM_FI_DEV_GPU_UTIL{job=\"nvidia-dcgm-exporter\",exported_namespace=\"\",pod_namespace=\"\"}[60s])"
        ),
        "{}",
        util.promql(60, f(Some("coder"), None, job), false)
    );
    // The exporter's job comes first, whatever else narrows the query.
    let one = ["dcgm\"x".to_string()];
    let with_job = Filters { jobs: &one, ..f(None, None, Some("exported_namespace=\"coder\"")) };
    assert_eq!(
        spec.promql(60, with_job, false),
        "max_over_time(DCGM_FI_PROF_SM_ACTIVE{job=\"dcgm\\\"x\",exported_namespace=\"coder\"}[60s])"
    );
    // Several jobs: each matched exactly, their selects `or`ed (no regular expression).
    let two = ["a.b".to_string(), "c|d".to_string()];
    assert_eq!(
        spec.promql(60, Filters { jobs: &two, ..f(None, None, None) }, false),
        "max_over_time(DCGM_FI_PROF_SM_ACTIVE{job=\"a.b\"}[60s]) or max_over_time(DCGM_FI_PROF_SM_ACTIVE{job=\"c|d\"}[60s])"
    );
    let names: Vec<&str> = QuerySpec::all(true).iter().map(|q| q.name).collect();
    assert_eq!(names.len(), NAMES.len() + 2, "every field name the decisions read, and the energy counter by both names");
    assert!(names.contains(&"DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION") && names.contains(&"DCGM_FI_DEV_GPU_ENERGY_JOULES_TOTAL"));
    assert!(names.contains(&"DCGM_FI_PROF_GR_ENGINE_UTIL_RATIO"));
    let without: Vec<&str> = QuerySpec::all(false).iter().map(|q| q.name).collect();
    assert_eq!(without.len(), names.len() - 2, "no power draw unless a power veto reads it");
    assert!(!without.iter().any(|n| n.contains("POWER")));
}

/// Copies are counted per job: one GPU two configured jobs both scrape is no copy.
#[test]
fn copies_are_counted_per_job() {
    let two = ["a".to_string(), "b".to_string()];
    let f = Filters { namespace: None, workspace_label: None, selector: None, jobs: &two };
    let q = QuerySpec { name: "DCGM_FI_DEV_FB_USED" }.copies(60, f);
    assert!(q.starts_with(&format!("count by ({}, job) (", BY.join(", "))) && q.ends_with(") > 1"), "{q}");
}

/// A series of a workspace the listing does not name is parsed once a fetch, not once per
/// field, and still noted when a later field has its point at the latest step.
#[test]
fn an_unlisted_workspace_is_parsed_once_and_noted_by_any_field() {
    let mut fold = fold(1 << 20);
    fold.wanted = Some(Arc::new(Wanted::default()));
    fold.span = (0, 120);
    let id = "0b7c3f6e-1d2a-4c5b-9e8f-7a6b5c4d3e2f";
    let labels = format!(r#"{{"UUID":"GPU-1","pod":"coder-{id}-6d9f8b7c5-x2x9k","namespace":"coder"}}"#);
    fold.add_read(QuerySpec { name: "DCGM_FI_PROF_SM_ACTIVE" }, labels.as_bytes(), &[(60.0, Some(0.0))]).unwrap();
    assert!(fold.unlisted.is_empty(), "no point at the latest step yet");
    assert_eq!(fold.memo.len(), 1, "remembered");
    fold.add_read(QuerySpec { name: "DCGM_FI_DEV_GPU_UTIL" }, labels.as_bytes(), &[(120.0, Some(0.0))]).unwrap();
    fold.add_read(QuerySpec { name: "DCGM_FI_DEV_FB_USED" }, labels.as_bytes(), &[(120.0, Some(1.0))]).unwrap();
    assert_eq!(fold.unlisted, [id], "noted once, by the field that has the latest step");
    assert!(fold.series.is_empty(), "nobody's series is held");
}
