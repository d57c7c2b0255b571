//! Logging set up from the settings: text for people, or one flat JSON object per line for log
//! pipelines. A pass runs in a `pass` span and each action on a workspace in a `workspace` span
//! (`workspace_span`) carrying its id, owner and template; the JSON lines carry those fields
//! beside the event's own, flat (`"workspace_id"` at the top, as operators grep for it), so no
//! event writes them by hand.

use std::fmt;

use serde_json::{Map, Value};
use tracing::field::{Field, Visit};
use tracing::{Event, Subscriber};
use tracing_subscriber::fmt::format::{JsonFields, Writer};
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields, FormattedFields};
use tracing_subscriber::registry::LookupSpan;

/// Logs to stderr at `level` and above: one JSON object per line, or text.
pub fn init(json: bool, level: tracing::Level) {
    let builder = tracing_subscriber::fmt().with_max_level(level).with_writer(std::io::stderr).with_target(false);
    let _ =
        if json { builder.fmt_fields(JsonFields::new()).event_format(FlatJson).try_init() } else { builder.with_ansi(false).try_init() };
}

/// The span of one action on one workspace: every line inside it names the workspace. At the
/// highest level, so it is on whatever level the log is written at (`plan` and `check` write
/// warnings only): its fields belong on every line inside it.
pub fn workspace_span(workspace_id: &str, owner: &str, template: &str) -> tracing::Span {
    tracing::error_span!("workspace", workspace_id = %workspace_id, owner = %owner, template = %template)
}

/// One JSON object per event: `timestamp`, `level`, the fields of every span it is in (outermost
/// first), then its own fields (which win over a span's of the same name).
struct FlatJson;

impl<S, N> FormatEvent<S, N> for FlatJson
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(&self, ctx: &FmtContext<'_, S, N>, mut writer: Writer<'_>, event: &Event<'_>) -> fmt::Result {
        let mut line = Map::new();
        line.insert("timestamp".into(), chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Micros, true).into());
        line.insert("level".into(), event.metadata().level().as_str().into());
        if let Some(scope) = ctx.event_scope() {
            for span in scope.from_root() {
                let extensions = span.extensions();
                let Some(fields) = extensions.get::<FormattedFields<N>>() else { continue };
                if let Ok(Value::Object(fields)) = serde_json::from_str::<Value>(fields.as_str()) {
                    line.extend(fields);
                }
            }
        }
        event.record(&mut Fields(&mut line));
        writeln!(writer, "{}", Value::Object(line))
    }
}

/// An event's fields, as JSON values.
struct Fields<'a>(&'a mut Map<String, Value>);

impl Visit for Fields<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().into(), value.into());
    }
    fn record_i64(&mut self, field: &Field, value: i64) {
        self.0.insert(field.name().into(), value.into());
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        self.0.insert(field.name().into(), value.into());
    }
    fn record_f64(&mut self, field: &Field, value: f64) {
        self.0.insert(field.name().into(), value.into());
    }
    fn record_bool(&mut self, field: &Field, value: bool) {
        self.0.insert(field.name().into(), value.into());
    }
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.0.insert(field.name().into(), format!("{value:?}").into());
    }
}

/// Text for a terminal with every control character but the line break written out (`\u{1b}`):
/// workspace, owner and template names come from Coder and may hold escape sequences that
/// would rewrite what a terminal shows (`report`, `backtest` and `plan` tables).
pub fn terminal_safe(text: String) -> String {
    if !text.chars().any(|c| c.is_control() && c != '\n') {
        return text;
    }
    text.chars().map(|c| if c.is_control() && c != '\n' { c.escape_unicode().to_string() } else { c.to_string() }).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};
    use tracing_subscriber::fmt::MakeWriter;

    #[derive(Clone, Default)]
    struct Captured(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Captured {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl<'a> MakeWriter<'a> for Captured {
        type Writer = Captured;
        fn make_writer(&'a self) -> Captured {
            self.clone()
        }
    }

    #[test]
    fn span_fields_are_flat_beside_the_events_own() {
        let out = Captured::default();
        let subscriber = tracing_subscriber::fmt().with_writer(out.clone()).fmt_fields(JsonFields::new()).event_format(FlatJson).finish();
        tracing::subscriber::with_default(subscriber, || {
            let _pass = tracing::info_span!("pass", pass = 7u64).entered();
            let _ws = workspace_span("0b7c1a2e", "alice", "gpu-a10g").entered();
            tracing::info!(event = "stop_sent", attempt = 2u32, reply_lost = false, build = %"b-1", "was \"stopped\"");
            tracing::warn!(event = "outside", owner = "bob", "an event's own field wins");
        });
        let text = String::from_utf8(out.0.lock().unwrap().clone()).unwrap();
        let lines: Vec<Value> = text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
        assert_eq!(lines.len(), 2, "{text}");
        let l = &lines[0];
        assert_eq!(
            (l["event"].as_str(), l["workspace_id"].as_str(), l["owner"].as_str()),
            (Some("stop_sent"), Some("0b7c1a2e"), Some("alice"))
        );
        assert_eq!((l["pass"].as_u64(), l["attempt"].as_u64(), l["reply_lost"].as_bool()), (Some(7), Some(2), Some(false)));
        assert_eq!((l["level"].as_str(), l["message"].as_str(), l["build"].as_str()), (Some("INFO"), Some("was \"stopped\""), Some("b-1")));
        assert!(l["timestamp"].as_str().is_some_and(|t| t.ends_with('Z')), "{l}");
        assert_eq!(lines[1]["owner"], "bob");
    }

    #[test]
    fn control_characters_reach_no_terminal() {
        assert_eq!(terminal_safe("plain\nlines\n".into()), "plain\nlines\n");
        assert_eq!(terminal_safe("eve\u{1b}[2J\u{7}\r\n".into()), "eve\\u{1b}[2J\\u{7}\\u{d}\n");
    }
}
