//! The exposition parser: every syntax case, a render/parse round trip and a never-panics
//! property, and the realistic fixtures (legacy and 4.9 names, pods, no pod, MIG).

use std::sync::Arc;

use chrono::Utc;
use coder_gpu_reclaimer::gpu::expo::{parse, render_sample};
use coder_gpu_reclaimer::gpu::scrape::{ScrapeFold, series_from_exposition};
use coder_gpu_reclaimer::gpu::signals::Signal;
use coder_gpu_reclaimer::gpu::{Attribution, Ownership};
use proptest::prelude::*;

use crate::common::{WS_ID, fixture};

#[test]
fn syntax_cases() {
    type Want = (&'static str, Vec<(&'static str, &'static str)>, f64, Option<i64>);
    let ok: Vec<(&str, Want)> = vec![
        ("up 1", ("up", vec![], 1.0, None)),
        ("up{} 1", ("up", vec![], 1.0, None)),
        ("m{a=\"x\"} 2.5", ("m", vec![("a", "x")], 2.5, None)),
        ("m{a=\"x\",} 2", ("m", vec![("a", "x")], 2.0, None)),
        ("m{a=\"x\", b=\"y\"} 3", ("m", vec![("a", "x"), ("b", "y")], 3.0, None)),
        ("m { a = \"x\" } 3", ("m", vec![("a", "x")], 3.0, None)),
        ("m{a=\"q\\\"uote\"} 1", ("m", vec![("a", "q\"uote")], 1.0, None)),
        ("m{a=\"back\\\\slash\"} 1", ("m", vec![("a", "back\\slash")], 1.0, None)),
        ("m{a=\"new\\nline\"} 1", ("m", vec![("a", "new\nline")], 1.0, None)),
        ("m{a=\"comma,brace}\"} 1", ("m", vec![("a", "comma,brace}")], 1.0, None)),
        ("m 1.458255915e9", ("m", vec![], 1.458255915e9, None)),
        ("m -2E-3", ("m", vec![], -0.002, None)),
        ("m +Inf", ("m", vec![], f64::INFINITY, None)),
        ("m -Inf", ("m", vec![], f64::NEG_INFINITY, None)),
        ("m 1 1395066363000", ("m", vec![], 1.0, Some(1_395_066_363_000))),
        ("m 1 -5", ("m", vec![], 1.0, Some(-5))),
        ("\tm\t7\t", ("m", vec![], 7.0, None)),
        ("ns:sub_name_1 0", ("ns:sub_name_1", vec![], 0.0, None)),
        ("m{pod=\"\"} 0", ("m", vec![("pod", "")], 0.0, None)),
        ("m{a=\"ünï\"} 1", ("m", vec![("a", "ünï")], 1.0, None)),
    ];
    for (line, (name, labels, value, ts)) in ok {
        let text = format!("# HELP m x\n# TYPE m gauge\n\n# a comment\n{line}\n");
        let (samples, errors) = parse(&text);
        assert!(errors.is_empty(), "{line:?}: {errors:?}");
        assert_eq!(samples.len(), 1, "{line:?}");
        let s = &samples[0];
        assert_eq!(s.name, name, "{line:?}");
        let got: Vec<(&str, &str)> = s.labels.iter().map(|(k, v)| (*k, v.as_ref())).collect();
        assert_eq!(got, labels, "{line:?}");
        assert_eq!(s.value, value, "{line:?}");
        assert_eq!(s.timestamp_ms, ts, "{line:?}");
    }
    let (nan, _) = parse("m NaN\n");
    assert!(nan[0].value.is_nan());

    let bad = [
        ("m", "missing value"),
        ("m{a=\"x\" 1", "expected ',' or '}'"),
        ("m{a=x} 1", "must be in double quotes"),
        ("m{a=\"x} 1", "unterminated value"),
        ("m{=\"x\"} 1", "expected a label name"),
        ("m{a} 1", "expected '='"),
        ("m abc", "is not a number"),
        ("m infinity", "is not a number"),
        ("m 1 2.5", "timestamp"),
        ("9m 1", "must start with a letter"),
        ("m{a=\"x\"}1", "expected a space"),
        ("m{", "unterminated label set"),
    ];
    for (line, want) in bad {
        let text = format!("ok 1\n{line}\nok 2\n");
        let (samples, errors) = parse(&text);
        assert_eq!(samples.len(), 2, "{line:?}: the other lines still parse");
        assert_eq!(errors.len(), 1, "{line:?}");
        assert_eq!(errors[0].line, 2, "{line:?}");
        assert!(errors[0].message.contains(want), "{line:?}: {}", errors[0]);
    }
}

fn label_value() -> impl Strategy<Value = String> {
    proptest::collection::vec(
        prop_oneof![
            Just('a'),
            Just('Z'),
            Just('0'),
            Just(' '),
            Just(','),
            Just('"'),
            Just('\\'),
            Just('\n'),
            Just('}'),
            Just('{'),
            Just('='),
            Just('é')
        ],
        0..12,
    )
    .prop_map(|cs| cs.into_iter().collect())
}

fn name() -> impl Strategy<Value = String> {
    (
        prop_oneof![Just('a'), Just('_'), Just(':'), Just('D')],
        proptest::collection::vec(prop_oneof![Just('a'), Just('_'), Just('9'), Just('F')], 0..10),
    )
        .prop_map(|(c, rest)| std::iter::once(c).chain(rest).collect())
}

fn label_name() -> impl Strategy<Value = String> {
    (prop_oneof![Just('a'), Just('_'), Just('U')], proptest::collection::vec(prop_oneof![Just('b'), Just('_'), Just('7')], 0..8))
        .prop_map(|(c, rest)| std::iter::once(c).chain(rest).collect())
}

fn value() -> impl Strategy<Value = f64> {
    prop_oneof![
        any::<f64>(),
        Just(f64::NAN),
        Just(f64::INFINITY),
        Just(f64::NEG_INFINITY),
        (0u32..1_000_000).prop_map(|n| n as f64 / 1000.0)
    ]
}

proptest! {
    #[test]
    fn render_then_parse_round_trips(samples in proptest::collection::vec((name(), proptest::collection::vec((label_name(), label_value()), 0..5), value()), 1..20)) {
        let mut text = String::new();
        for (n, labels, v) in &samples {
            let labels: Vec<(&str, &str)> = labels.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
            render_sample(&mut text, n, &labels, *v);
        }
        let (parsed, errors) = parse(&text);
        prop_assert!(errors.is_empty(), "{:?}\n{}", errors, text);
        prop_assert_eq!(parsed.len(), samples.len());
        for (p, (n, labels, v)) in parsed.iter().zip(&samples) {
            prop_assert_eq!(p.name, n.as_str());
            let got: Vec<(String, String)> = p.labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
            prop_assert_eq!(&got, labels);
            prop_assert!((p.value.is_nan() && v.is_nan()) || p.value == *v, "{} vs {}", p.value, v);
        }
    }

    #[test]
    fn never_panics_and_reports_real_line_numbers(text in "\\PC{0,300}") {
        let (_, errors) = parse(&text);
        let lines = text.split('\n').count();
        for e in errors.kept() {
            prop_assert!(e.line >= 1 && e.line <= lines);
        }
    }

    #[test]
    fn never_panics_on_exposition_like_bytes(parts in proptest::collection::vec(prop_oneof![Just("m"), Just("{"), Just("}"), Just("\""), Just("\\"), Just("="), Just(","), Just(" "), Just("\n"), Just("1"), Just("e"), Just("#"), Just("é"), Just("NaN")], 0..80)) {
        let text: String = parts.concat();
        let _ = parse(&text);
    }
}

#[test]
fn the_realistic_legacy_fixture_maps_to_workspaces() {
    let text = fixture("dcgm/exporter-4.8.txt");
    let (samples, errors) = parse(&text);
    assert!(errors.is_empty(), "{errors:?}");
    assert_eq!(samples.len(), 14);
    let src: Arc<str> = Arc::from("http://10.0.0.7:9400/metrics");
    let (readings, errors) = series_from_exposition(&text, Utc::now(), &src, &Ownership::default());
    assert!(errors.is_empty());
    assert_eq!(readings.len(), 4, "GPU 0, GPU 1 and two MIG instances");
    let gpu0 = readings.iter().find(|r| r.key.uuid.starts_with("GPU-585834da")).unwrap();
    assert_eq!(gpu0.workspace_id.as_deref(), Some(WS_ID));
    crate::common::assert_close(gpu0.points[0].values.get(Signal::GpuUtil), Some(1.0), "100% becomes the ratio 1.0");
    crate::common::assert_close(gpu0.points[0].values.get(Signal::SmActive), Some(0.012), "");
    crate::common::assert_close(gpu0.points[0].values.get(Signal::FbUsedMib), Some(302.0), "");
    crate::common::assert_close(gpu0.points[0].values.get(Signal::PowerWatts), Some(90.0), "");
    assert_eq!(gpu0.model.as_deref(), Some("NVIDIA L40S"));
    let gpu1 = readings.iter().find(|r| r.key.uuid.starts_with("GPU-7f3e")).unwrap();
    assert_eq!((gpu1.workspace_id.as_deref(), gpu1.key.pod.as_deref()), (None, None), "no pod labels: nobody's");
    let mig: Vec<_> = readings.iter().filter(|r| r.key.gpu_instance.is_some()).collect();
    assert_eq!(mig.len(), 2, "MIG instances share the parent UUID and differ by GPU_I_ID");
    let owned = mig.iter().find(|r| r.key.gpu_instance.as_deref() == Some("1")).unwrap();
    assert_eq!(owned.workspace_id.as_deref(), Some("5d1e2f3a-4b5c-4d6e-8f7a-9b0c1d2e3f4a"));
    let empty = mig.iter().find(|r| r.key.gpu_instance.as_deref() == Some("2")).unwrap();
    assert_eq!(empty.workspace_id, None, "pod=\"\" means no owner");
    assert_eq!(owned.points[0].values.get(Signal::GpuUtil), None, "no GPU_UTIL for MIG instances");
}

#[test]
fn the_49_names_normalise_to_the_same_units() {
    let src: Arc<str> = Arc::from("x");
    let (readings, errors) = series_from_exposition(&fixture("dcgm/exporter-4.9-names.txt"), Utc::now(), &src, &Ownership::default());
    assert!(errors.is_empty());
    assert_eq!(readings.len(), 1);
    let r = &readings[0];
    assert_eq!(r.workspace_id.as_deref(), Some(WS_ID));
    crate::common::assert_close(r.points[0].values.get(Signal::GpuUtil), Some(1.0), "");
    crate::common::assert_close(r.points[0].values.get(Signal::FbUsedMib), Some(302.0), "bytes become MiB");
    crate::common::assert_close(r.points[0].values.get(Signal::SmActive), Some(0.012), "");
    crate::common::assert_close(r.points[0].values.get(Signal::GrEngineActive), Some(1.0), "");
    crate::common::assert_close(r.points[0].values.get(Signal::PowerWatts), Some(90.0), "");
}

#[test]
fn the_fake_exporter_renders_what_the_parser_expects() {
    let world = mocks::World::new(mocks::WorldConfig { gpus: 2, ..mocks::WorldConfig::default() });
    for cfg in [
        mocks::ExporterConfig::default(),
        mocks::ExporterConfig { names: mocks::Names::V49, ..mocks::ExporterConfig::default() },
        mocks::ExporterConfig { mig: true, ..mocks::ExporterConfig::default() },
        mocks::ExporterConfig { profiling: false, ..mocks::ExporterConfig::default() },
    ] {
        let text = mocks::exporter::render(&world, &cfg, &[1.0e9; 4]);
        let (samples, errors) = parse(&text);
        assert!(errors.is_empty() && !samples.is_empty(), "{cfg:?}: {errors:?}");
        let src: Arc<str> = Arc::from("x");
        let (readings, _) = series_from_exposition(&text, Utc::now(), &src, &Ownership::default());
        assert_eq!(readings.len(), 2, "{cfg:?}");
        for r in &readings {
            crate::common::assert_close(r.points[0].values.get(Signal::PowerWatts), Some(24.3), "{cfg:?}: idle GPUs draw 24.3 W");
            assert_eq!(r.points[0].values.get(Signal::SmActive).is_some(), cfg.profiling, "{cfg:?}");
            assert_eq!(r.points[0].values.get(Signal::GpuUtil).is_some(), !cfg.mig, "{cfg:?}");
        }
    }
}

#[test]
fn virtual_gpu_series_are_read_by_the_device_not_the_pods_zeros() {
    let src: Arc<str> = Arc::from("x");
    let (readings, errors) = series_from_exposition(&fixture("dcgm/exporter-vgpu.txt"), Utc::now(), &src, &Ownership::default());
    assert!(errors.is_empty(), "{errors:?}");
    let owned: Vec<_> = readings.iter().filter(|r| r.workspace_id.is_some()).collect();
    assert_eq!(owned.len(), 2, "two pods share the device");
    for r in owned {
        assert_eq!(r.attribution, Attribution::Shared, "the vgpu label marks a shared GPU");
        crate::common::assert_close(r.points[0].values.get(Signal::GpuUtil), Some(0.87), "the device's utilization, not the pod's 0");
        crate::common::assert_close(r.points[0].values.get(Signal::FbUsedMib), Some(31_420.0), "the device's memory, not the pod's 0");
        crate::common::assert_close(r.points[0].values.get(Signal::SmActive), Some(0.803), "");
        assert_eq!(r.points[0].energy_joules, Some(98_765_432.101));
    }
    let device = readings.iter().find(|r| r.workspace_id.is_none()).unwrap();
    assert!(device.attribution == Attribution::Exclusive && device.key.pod.is_none());
}

#[test]
fn stuck_counters_in_real_layout_read_as_metrics_disagree() {
    use coder_gpu_reclaimer::gpu::window::Windows;
    use coder_gpu_reclaimer::pass::decide::{Reason, Verdict, decide};
    use coder_gpu_reclaimer::pass::policy::Policy;
    let interval = std::time::Duration::from_secs(60);
    let p = Policy::defaults(interval);
    let mut windows = Windows::new(chrono::Duration::hours(1), interval);
    let src: Arc<str> = Arc::from("x");
    let now = Utc::now();
    for m in (0..=40).rev() {
        let at = now - chrono::Duration::minutes(m);
        // The hostengine is alive: the energy counters rise (about 15 kJ a minute at 250 W).
        let rise = (40 - m) * 15_000_000;
        let text = fixture("dcgm/exporter-stuck.txt")
            .replace(" 98765432101", &format!(" {}", 98_765_432_101 + rise))
            .replace(" 87654321012", &format!(" {}", 87_654_321_012 + rise));
        let (readings, _) = series_from_exposition(&text, at, &src, &Ownership::default());
        readings.iter().for_each(|r| windows.record(r, None, false));
        windows.flush();
    }
    for id in [WS_ID, "5d3e1f0a-2b4c-4d6e-8f10-3a5b7c9d1e2f"] {
        let ws = crate::common::running_workspace(id, now - chrono::Duration::minutes(40));
        let d = decide(now, &ws, windows.get(id), &p, None);
        assert_eq!((d.verdict, d.reason), (Verdict::Unknown, Reason::MetricsDisagree), "{id}: {}", d.message);
    }
}

#[test]
fn negative_and_nan_values_are_no_reading() {
    let mut world = mocks::World::new(mocks::WorldConfig { gpus: 1, ..mocks::WorldConfig::default() });
    let id = world.create_workspace("alice", "a", None).unwrap();
    world.set_load(id, mocks::Load::Matmul);
    let cfg = mocks::ExporterConfig { broken_values: true, ..mocks::ExporterConfig::default() };
    let text = mocks::exporter::render(&world, &cfg, &[1.0e9]);
    assert!(text.contains("} NaN") && text.contains("} -1"), "the fake writes both:\n{text}");
    let src: Arc<str> = Arc::from("x");
    let (readings, errors) = series_from_exposition(&text, Utc::now(), &src, &Ownership::default());
    assert!(errors.is_empty(), "{errors:?}");
    let r = &readings[0];
    assert_eq!(
        (r.points[0].values.get(Signal::GpuUtil), r.points[0].values.get(Signal::FbUsedMib)),
        (None, None),
        "absent, never 0 or negative"
    );
    assert!(r.points[0].values.get(Signal::SmActive).is_some(), "the other fields stay");
}

/// The device labels and the workspace pod of `reference/dcgm/LAYOUTS.md`.
const GPU0: &str = r#"gpu="0",UUID="GPU-5b3e1a2c-7d4f-4e8a-9c1b-2f6d8e0a4b71",pci_bus_id="00000000:00:1E.0",device="nvidia0",modelName="NVIDIA H100 80GB HBM3",Hostname="gpu-node-3",DCGM_FI_DRIVER_VERSION="550.54.15""#;
const W: &str = r#"container="dev",namespace="coder",pod="coder-0b7c1a2e-1f4d-4c9e-9d3b-2f6a8e1c5d70-6d9f8b7c5-x2x9k""#;
const W2: &str = r#"container="dev",namespace="coder",pod="coder-5d3e1f0a-2b4c-4d6e-8f10-3a5b7c9d1e2f-6c8e7a5b4d-q7w2e""#;

/// Each workspace's one reading of `text` (LAYOUTS.md's lines with `<gpu0>`, `<w>`, `<w2>` filled in).
fn readings_of(text: &str, ownership: &Ownership) -> Vec<(String, coder_gpu_reclaimer::gpu::signals::SignalValues)> {
    let text = text.replace("<gpu0>", GPU0).replace("<w>", W).replace("<w2>", W2);
    let (series, errors) = series_from_exposition(&text, Utc::now(), &Arc::from("x"), ownership);
    assert!(errors.is_empty(), "{errors:?}");
    let mut owned: Vec<_> = series.into_iter().filter_map(|s| Some((s.workspace_id?.to_string(), s.points[0].values))).collect();
    owned.sort_by(|a, b| a.0.cmp(&b.0));
    owned
}

#[test]
fn virtual_gpu_mode_gives_each_pod_the_devices_readings_and_keeps_its_copies() {
    use crate::common::assert_close;
    // LAYOUTS §3: an exclusive GPU in virtual-GPU mode under the chart's defaults. The pod's
    // GPU_UTIL/FB_USED read 0 with an empty pod_uid and no vgpu label: not the pod's reading.
    let exclusive = "DCGM_FI_DEV_GPU_UTIL{<gpu0>} 98\nDCGM_FI_DEV_GPU_UTIL{<gpu0>,<w>,pod_uid=\"\"} 0\n\
        DCGM_FI_DEV_FB_USED{<gpu0>} 61234\nDCGM_FI_DEV_FB_USED{<gpu0>,<w>,pod_uid=\"\"} 0\n\
        DCGM_FI_DEV_POWER_USAGE{<gpu0>,<w>} 612.400000\nDCGM_FI_PROF_GR_ENGINE_ACTIVE{<gpu0>,<w>} 0.970000\n";
    let got = readings_of(exclusive, &Ownership::default());
    assert_eq!(got.len(), 1);
    let v = got[0].1;
    assert_close(v.get(Signal::GpuUtil), Some(0.98), "the device's utilization");
    assert_close(v.get(Signal::FbUsedMib), Some(61_234.0), "the device's memory, not the placeholder 0 (read as phantom before)");
    assert_close(v.get(Signal::PowerWatts), Some(612.4), "the pod's copy of the device's power");
    // LAYOUTS §4: time-sliced, two pods encoding video. ENC_UTIL and power exist only as per-pod
    // copies; both pods keep them (they were cleared, and the transcoder reclaimed as idle).
    let sliced = "DCGM_FI_DEV_GPU_UTIL{<gpu0>} 0\nDCGM_FI_DEV_GPU_UTIL{<gpu0>,<w>,pod_uid=\"\",vgpu=\"0\"} 0\n\
        DCGM_FI_DEV_FB_USED{<gpu0>} 1200\nDCGM_FI_DEV_ENC_UTIL{<gpu0>,<w>,vgpu=\"0\"} 85\nDCGM_FI_DEV_ENC_UTIL{<gpu0>,<w2>,vgpu=\"1\"} 85\n\
        DCGM_FI_DEV_POWER_USAGE{<gpu0>,<w>,vgpu=\"0\"} 118.200000\n";
    let got = readings_of(sliced, &Ownership::default());
    assert_eq!(got.len(), 2, "{got:?}");
    for (ws, v) in &got {
        assert_close(v.get(Signal::EncUtil), Some(0.85), ws);
        assert_close(v.get(Signal::FbUsedMib), Some(1_200.0), ws);
    }
    assert_close(got[0].1.get(Signal::PowerWatts), Some(118.2), "W's copy of the device's power");
}

#[test]
fn the_first_pod_label_that_names_a_workspace_is_the_workload() {
    // LAYOUTS §6 with -o: `pod_name` is the workload, `pod` the exporter (nothing collides, so
    // nothing is renamed). `pod` was taken before, and no GPU mapped to any workspace.
    let target = r#"container="nvidia-dcgm-exporter",namespace="gpu-operator",pod="nvidia-dcgm-exporter-7xk2p",instance="10.0.3.7:9400",job="nvidia-dcgm-exporter""#;
    let old_names = format!(
        "DCGM_FI_DEV_GPU_UTIL{{<gpu0>,container_name=\"dev\",pod_name=\"coder-{WS_ID}-6d9f8b7c5-x2x9k\",pod_namespace=\"coder\",{target}}} 97\n"
    );
    for ns in [None, Some("coder")] {
        let own = Ownership { namespace: ns.map(str::to_string), workspace_id_label: None };
        let got = readings_of(&old_names, &own);
        assert_eq!(
            got.iter().map(|(w, _)| w.as_str()).collect::<Vec<_>>(),
            [WS_ID],
            "namespace filter {ns:?}: pod_namespace goes with pod_name"
        );
    }
    // LAYOUTS §6's renamed labels are Prometheus's: dcgm-exporter never writes `exported_*`
    // itself, so a scraped body that does is a forgery and names nobody (issue 31; behind
    // Prometheus the readings matrix reads them, honorLabels false).
    let behind = format!(
        "DCGM_FI_DEV_FB_USED{{<gpu0>,{target}}} 61234\n\
         DCGM_FI_DEV_FB_USED{{<gpu0>,exported_container=\"dev\",exported_namespace=\"coder\",exported_pod=\"coder-{WS_ID}-6d9f8b7c5-x2x9k\",{target}}} 0\n\
         DCGM_FI_PROF_GR_ENGINE_ACTIVE{{<gpu0>,exported_container=\"dev\",exported_namespace=\"coder\",exported_pod=\"coder-{WS_ID}-6d9f8b7c5-x2x9k\",{target}}} 0.970000\n"
    );
    for ns in [None, Some("coder")] {
        let got = readings_of(&behind, &Ownership { namespace: ns.map(str::to_string), workspace_id_label: None });
        assert!(got.is_empty(), "an exported_pod in a scraped body speaks for nobody: {got:?}");
    }
}

/// Issue 34 item 2 (reference dcgm NOTES §11.1): in the default layout with
/// `--kubernetes-enable-pod-uid` and no pod read access, the pod's own series carry
/// `pod_uid=""` with the device's real values, and there is no device-level series beside them.
#[test]
fn an_empty_pod_uid_without_a_device_level_series_is_the_devices_own_reading() {
    let src: Arc<str> = Arc::from("x");
    let text = fixture("dcgm/exporter-4.8.txt").replace("-x2x9k\"}", "-x2x9k\",pod_uid=\"\"}");
    assert!(text.contains("pod_uid=\"\"}"), "the fixture's pod series carry the empty pod_uid");
    let (readings, errors) = series_from_exposition(&text, Utc::now(), &src, &Ownership::default());
    assert!(errors.is_empty(), "{errors:?}");
    let pod = readings.iter().find(|r| r.workspace_id.is_some()).unwrap();
    assert_eq!(pod.points[0].values.get(Signal::GpuUtil), Some(1.0), "kept: the device's own utilization");
    assert!(pod.points[0].values.get(Signal::FbUsedMib).is_some_and(|fb| fb > 0.0), "kept: the device's own memory");
    // Beside a device-level series (virtual-GPU mode) the same empty pod_uid is a placeholder.
    let (vgpu, _) = series_from_exposition(
        &fixture("dcgm/exporter-vgpu.txt").replace("pod_uid=\"7c2d9e10-3b4a-4f5e-8d6c-1a2b3c4d5e6f\"", "pod_uid=\"\""),
        Utc::now(),
        &src,
        &Ownership::default(),
    );
    let sharer = vgpu.iter().find(|r| r.workspace_id.as_deref() == Some("0b7c1a2e-1f4d-4c9e-9d3b-2f6a8e1c5d70")).unwrap();
    crate::common::assert_close(sharer.points[0].values.get(Signal::GpuUtil), Some(0.87), "the device's, not the placeholder 0");
}

/// Issue 34 item 5 (reference dcgm NOTES §11.2): with `hostPID` and the pod informer, a time-sliced
/// sharer's `GPU_UTIL`/`FB_USED` are its own processes'; its power and profiling copies are the
/// whole device's. A busy sharer no longer keeps an idle one.
#[test]
fn time_sliced_sharers_with_their_own_process_readings_are_judged_by_them() {
    let src: Arc<str> = Arc::from("x");
    let busy =
        "pod=\"coder-0b7c1a2e-1f4d-4c9e-9d3b-2f6a8e1c5d70-7d9f8b6c5d-x2x9k\",pod_uid=\"7c2d9e10-3b4a-4f5e-8d6c-1a2b3c4d5e6f\",vgpu=\"0\"}";
    let mut text = String::new();
    for line in fixture("dcgm/exporter-vgpu.txt").lines() {
        let own = match line {
            l if l.starts_with("DCGM_FI_DEV_GPU_UTIL{") && l.contains(busy) => Some("85"),
            l if l.starts_with("DCGM_FI_DEV_FB_USED{") && l.contains(busy) => Some("31000"),
            _ => None,
        };
        match own {
            Some(v) => text.push_str(&format!("{} {v}\n", line.rsplit_once(' ').unwrap().0)),
            None => text.push_str(&format!("{line}\n")),
        }
    }
    let (readings, errors) = series_from_exposition(&text, Utc::now(), &src, &Ownership::default());
    assert!(errors.is_empty(), "{errors:?}");
    let of = |id: &str| readings.iter().find(|r| r.workspace_id.as_deref() == Some(id)).unwrap().points[0];
    let (busy, idle) = (of("0b7c1a2e-1f4d-4c9e-9d3b-2f6a8e1c5d70"), of("5d3e1f0a-2b4c-4d6e-8f10-3a5b7c9d1e2f"));
    crate::common::assert_close(busy.values.get(Signal::GpuUtil), Some(0.85), "its own utilization");
    assert_eq!((idle.values.get(Signal::GpuUtil), idle.values.get(Signal::FbUsedMib)), (Some(0.0), Some(0.0)), "its own: nothing");
    for p in [busy, idle] {
        for s in [Signal::SmActive, Signal::GrEngineActive, Signal::PowerWatts] {
            assert_eq!(p.values.get(s), None, "{s:?} is the whole device's: nobody's own");
        }
        assert!(p.energy_joules.is_some(), "the energy counter still proves the readings move");
    }
}

/// NOTES §11.5: `DCGM_FI_DEV_GPU_UTIL_RATIO` is DCGM 4.6's field 203, an integer percent; DCGM
/// 4.7's ratio is a double the exporter writes with six decimals.
#[test]
fn a_utilization_ratio_written_as_an_integer_is_a_percent() {
    let src: Arc<str> = Arc::from("x");
    let line = |v: &str| {
        format!(
            "DCGM_FI_DEV_GPU_UTIL_RATIO{{gpu=\"0\",UUID=\"GPU-1\",modelName=\"NVIDIA A10G\"}} {v}\nDCGM_FI_DEV_ENC_UTIL_RATIO{{gpu=\"0\",UUID=\"GPU-1\",modelName=\"NVIDIA A10G\"}} {v}\n"
        )
    };
    for (text, want) in [("1", 0.01), ("1.000000", 1.0), ("0.250000", 0.25), ("37", 0.37)] {
        let (readings, errors) = series_from_exposition(&line(text), Utc::now(), &src, &Ownership::default());
        assert!(errors.is_empty(), "{errors:?}");
        for s in [Signal::GpuUtil, Signal::EncUtil] {
            crate::common::assert_close(readings[0].points[0].values.get(s), Some(want), format!("{s:?} written {text}"));
        }
    }
}

/// Issue 34 item 4 (NOTES §11.1): virtual-GPU copies carry no pod labels, so `workspace_id_label`
/// falls back to the workspace id in the pod name.
#[test]
fn a_series_without_the_workspace_label_is_found_by_its_pod_name() {
    let src: Arc<str> = Arc::from("x");
    let own = Ownership { namespace: None, workspace_id_label: Some("label_com_coder_workspace_id".into()) };
    let (readings, _) = series_from_exposition(&fixture("dcgm/exporter-vgpu.txt"), Utc::now(), &src, &own);
    let ids: std::collections::BTreeSet<&str> = readings.iter().filter_map(|r| r.workspace_id.as_deref()).collect();
    assert_eq!(ids.into_iter().collect::<Vec<_>>(), ["0b7c1a2e-1f4d-4c9e-9d3b-2f6a8e1c5d70", "5d3e1f0a-2b4c-4d6e-8f10-3a5b7c9d1e2f"]);
}

/// Issue 31: a body of nothing but bad lines costs a count, not a message per line (15 MiB of
/// short bad lines once held 1.26 GB of strings).
#[test]
fn a_body_of_bad_lines_keeps_the_first_few_and_a_count() {
    let text = "x{\n".repeat(100_000);
    let (_, errors) = parse(&text);
    assert_eq!(errors.len(), 100_000, "every bad line is counted");
    assert_eq!(errors.kept().len(), coder_gpu_reclaimer::gpu::expo::ParseErrors::KEPT, "only the first few are kept");
    assert_eq!(errors.first().map(|e| e.line), Some(1));
}

/// Per-process readings are trusted only when they account for the device's (NOTES §11.2): a
/// `GetProcessUtilization` that is not supported (every sharer's own utilization 0 while the
/// device computes), or a sharer whose `pod_uid` is empty, leaves every sharer on the device's.
#[test]
fn per_process_readings_that_do_not_add_up_are_not_trusted() {
    let src: Arc<str> = Arc::from("x");
    let busy =
        "pod=\"coder-0b7c1a2e-1f4d-4c9e-9d3b-2f6a8e1c5d70-7d9f8b6c5d-x2x9k\",pod_uid=\"7c2d9e10-3b4a-4f5e-8d6c-1a2b3c4d5e6f\",vgpu=\"0\"}";
    let with = |util: &str, fb: &str, empty_uid: bool| {
        let mut text = String::new();
        for line in fixture("dcgm/exporter-vgpu.txt").lines() {
            let own = match line {
                l if l.starts_with("DCGM_FI_DEV_GPU_UTIL{") && l.contains(busy) => Some(util),
                l if l.starts_with("DCGM_FI_DEV_FB_USED{") && l.contains(busy) => Some(fb),
                _ => None,
            };
            let line = match own {
                Some(v) => format!("{} {v}", line.rsplit_once(' ').unwrap().0),
                None => line.to_string(),
            };
            let line = if empty_uid { line.replace("pod_uid=\"9e8d7c6b-5a4f-4e3d-8c2b-1a0f9e8d7c6b\"", "pod_uid=\"\"") } else { line };
            text.push_str(&format!("{line}\n"));
        }
        let (readings, _) = series_from_exposition(&text, Utc::now(), &src, &Ownership::default());
        readings.into_iter().find(|r| r.workspace_id.as_deref() == Some("5d3e1f0a-2b4c-4d6e-8f10-3a5b7c9d1e2f")).unwrap()
    };
    let trusted = with("85", "31000", false);
    assert_eq!(trusted.attribution, Attribution::OwnProcesses, "the sums account for the device's 87 % and 31,420 MiB");
    for (what, idle) in [("utilization not supported", with("0", "31000", false)), ("a sharer not found", with("85", "31000", true))] {
        assert_eq!(idle.attribution, Attribution::Shared, "{what}");
        crate::common::assert_close(idle.points[0].values.get(Signal::GpuUtil), Some(0.87), what);
        crate::common::assert_close(idle.points[0].values.get(Signal::SmActive), Some(0.803), what);
    }
}

/// The fold of one body fed in chunks, as a scrape streams in.
fn fold_in_chunks(text: &[u8], cuts: &[usize]) -> (Vec<coder_gpu_reclaimer::gpu::GpuSeries>, coder_gpu_reclaimer::gpu::expo::ParseErrors) {
    let (src, ownership, at): (Arc<str>, _, _) = (Arc::from("x"), Ownership::default(), chrono::DateTime::UNIX_EPOCH);
    let mut fold = ScrapeFold::new(at, &src, &ownership, usize::MAX);
    let mut start = 0;
    for &cut in cuts.iter().chain([&text.len()]) {
        fold.feed(&text[start..cut.max(start)]);
        start = cut.max(start);
    }
    let (series, errors, _) = fold.finish();
    (series, errors)
}

/// A scrape is folded as it streams in: wherever its chunks are cut (inside a name, a label
/// set, a value, a multi-byte character, a CRLF ending, before the last line without a
/// newline), the series and the bad lines are those of the whole body read at once.
#[test]
fn a_body_folded_chunk_by_chunk_reads_as_the_whole_body() {
    let mut bodies: Vec<String> =
        ["dcgm/exporter-4.8.txt", "dcgm/exporter-4.9-names.txt", "dcgm/exporter-vgpu.txt", "dcgm/exporter-stuck.txt"].map(fixture).to_vec();
    // Bad lines among good ones, a label value in two-byte characters, CRLF endings, no final
    // newline.
    let mut odd = fixture("dcgm/exporter-4.8.txt").replace("NVIDIA L40S", "NVIDIA L40S ünï").replace('\n', "\r\n");
    odd.push_str("DCGM_FI_DEV_GPU_UTIL{UUID=\"GPU-1\" 5\r\nDCGM_FI_DEV_GPU_UTIL{UUID=\"GPU-2\",pod=\"coder-0b7c1a2e-1f4d-4c9e-9d3b-2f6a8e1c5d70-7d9f8b6c5d-x2x9k\"} 7");
    bodies.push(odd);
    for body in &bodies {
        let whole = fold_in_chunks(body.as_bytes(), &[]);
        assert!(!whole.0.is_empty());
        for cut in 0..=body.len() {
            assert_eq!(fold_in_chunks(body.as_bytes(), &[cut]), whole, "cut at byte {cut}");
        }
        for size in [1, 2, 3, 7, 64, 1000] {
            let cuts: Vec<usize> = (size..body.len()).step_by(size).collect();
            assert_eq!(fold_in_chunks(body.as_bytes(), &cuts), whole, "chunks of {size} bytes");
        }
    }
    let (_, errors) = fold_in_chunks(bodies.last().unwrap().as_bytes(), &[]);
    assert_eq!(errors.len(), 1, "{errors:?}");
}

/// Bytes are checked as UTF-8 only where they are read: a label set that is not UTF-8 is that
/// line's error, the other GPUs are read, and a comment's bytes are never looked at.
#[test]
fn a_label_set_that_is_not_utf8_is_a_bad_line_and_a_comment_is_not_read() {
    let good = "DCGM_FI_DEV_GPU_UTIL{UUID=\"GPU-1\",pod=\"coder-0b7c1a2e-1f4d-4c9e-9d3b-2f6a8e1c5d70-7d9f8b6c5d-x2x9k\"} 7\n";
    let mut body = b"# HELP DCGM_FI_DEV_GPU_UTIL \xff\xfe not text\n".to_vec();
    body.extend_from_slice(good.as_bytes());
    body.extend_from_slice(b"DCGM_FI_DEV_GPU_UTIL{UUID=\"GPU-\xff\"} 9\n");
    let (series, errors) = fold_in_chunks(&body, &[]);
    assert_eq!(series.len(), 1);
    assert_eq!(series[0].key.uuid, "GPU-1");
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert_eq!((errors[0].line, errors[0].message.as_str()), (3, "the label set is not UTF-8 text"));
}

/// A family the service does not read is skipped line by line without being parsed (its bad
/// lines are not errors, as no line of an unread family is), and the family after it is read
/// whole, even where its name begins with the skipped one's.
#[test]
fn a_family_not_read_is_skipped_and_the_next_is_read_whole() {
    let pod = "coder-0b7c1a2e-1f4d-4c9e-9d3b-2f6a8e1c5d70-7d9f8b6c5d-x2x9k";
    let body = format!(
        "DCGM_FI_DEV_GPU_UTIL{{UUID=\"GPU-1\",pod=\"{pod}\"}} 7\n\
         DCGM_FI_DEV_GPU{{UUID=\"GPU-1\",pod=\"{pod}\"}} 99\n\
         DCGM_FI_DEV_GPU{{UUID=\"GPU-1\" no value\n\
         DCGM_FI_DEV_GPU_TEMP{{UUID=\"GPU-1\",pod=\"{pod}\"}} 41\n\
         DCGM_FI_DEV_FB_USED{{UUID=\"GPU-1\",pod=\"{pod}\"}} 850\n\
         DCGM_FI_DEV_FB_USED{{UUID=\"GPU-2\",pod=\"{pod}\"}} 0\n"
    );
    let (series, errors) = fold_in_chunks(body.as_bytes(), &[]);
    assert!(errors.is_empty(), "{errors:?}");
    let gpus: Vec<&str> = series.iter().map(|s| s.key.uuid.as_str()).collect();
    assert_eq!(gpus, ["GPU-1", "GPU-2"]);
    let values = &series[0].points[0].values;
    crate::common::assert_close(values.get(Signal::GpuUtil), Some(0.07), "the family before the skipped one");
    crate::common::assert_close(values.get(Signal::FbUsedMib), Some(850.0), "the family after it");
    assert_eq!(series[1].points[0].values.get(Signal::FbUsedMib), Some(0.0), "its second line");
}

/// An exporter reloading answers with an empty body: blanks are no text, a comment is.
#[test]
fn only_blanks_are_an_empty_body() {
    let (src, ownership): (Arc<str>, _) = (Arc::from("x"), Ownership::default());
    for (body, text) in [("", false), ("\n\n", false), (" \t\r\n ", false), ("# HELP x y\n", true), ("\n  up", true)] {
        let mut fold = ScrapeFold::new(Utc::now(), &src, &ownership, 8);
        for b in body.as_bytes().chunks(1) {
            fold.feed(b);
        }
        assert_eq!(fold.any_text(), text, "{body:?}");
    }
}

proptest! {
    /// Values written as plain decimals (what dcgm-exporter writes) are read on a fast path:
    /// every one reads bit for bit as Rust's own parser reads it, and what it refuses is a bad
    /// line.
    #[test]
    fn a_plain_decimal_reads_as_the_standard_parser_reads_it(
        sign in prop_oneof![Just(""), Just("-"), Just("+")],
        whole in "[0-9]{0,18}",
        decimals in proptest::option::of("[0-9]{0,18}"),
    ) {
        let text = format!("{sign}{whole}{}", decimals.map(|d| format!(".{d}")).unwrap_or_default());
        let line = format!("m {text}\n");
        let (samples, errors) = parse(&line);
        match text.parse::<f64>() {
            Ok(want) => {
                prop_assert!(errors.is_empty(), "{text}: {errors:?}");
                prop_assert_eq!(samples[0].value.to_bits(), want.to_bits(), "{}", text);
            }
            Err(_) => prop_assert_eq!(errors.len(), 1, "{}", text),
        }
    }
}
