//! The OTLP encoding: spans and metrics into `ExportTraceServiceRequest` and
//! `ExportMetricsServiceRequest` (opentelemetry-proto's prost messages), as the protobuf bytes
//! an OTLP/HTTP collector takes. Pure.

use std::time::SystemTime;

use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{AnyValue, InstrumentationScope, KeyValue, any_value};
use opentelemetry_proto::tonic::metrics::v1::{Metric, ResourceMetrics, ScopeMetrics};
use opentelemetry_proto::tonic::resource::v1::Resource as ProtoResource;
use opentelemetry_proto::tonic::trace::v1::{
    ResourceSpans, ScopeSpans, Span, Status, span, status,
};
use prost::Message;

use super::{AttrValue, SpanData, SpanKind};

/// Names and string attributes longer than this are cut (at a character boundary): they may
/// carry what an agent sent (a tool name, a request id).
pub const MAX_STR: usize = 256;

/// The instrumentation scope of everything agentosd exports.
pub const SCOPE: &str = "agentosd";

/// The resource: who exports (`service.name=agentosd`, `service.version`, `host.name`).
#[derive(Debug, Clone, PartialEq)]
pub struct Resource {
    pub attrs: Vec<(String, AttrValue)>,
}

impl Resource {
    /// This daemon.
    pub fn daemon() -> Resource {
        let mut attrs = vec![
            ("service.name".to_string(), AttrValue::from("agentosd")),
            (
                "service.version".to_string(),
                AttrValue::from(env!("CARGO_PKG_VERSION")),
            ),
        ];
        if let Ok(h) = std::fs::read_to_string("/proc/sys/kernel/hostname") {
            attrs.push(("host.name".into(), AttrValue::Str(h.trim().to_string())));
        }
        Resource { attrs }
    }

    fn proto(&self) -> ProtoResource {
        ProtoResource {
            attributes: key_values(&self.attrs),
            ..Default::default()
        }
    }
}

fn scope() -> InstrumentationScope {
    InstrumentationScope {
        name: SCOPE.into(),
        version: env!("CARGO_PKG_VERSION").into(),
        ..Default::default()
    }
}

/// `s` cut to at most [`MAX_STR`] bytes.
pub fn cut(s: &str) -> String {
    if s.len() <= MAX_STR {
        return s.to_string();
    }
    let mut end = MAX_STR;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s[..end].to_string()
}

pub fn any(v: &AttrValue) -> AnyValue {
    let value = match v {
        AttrValue::Str(s) => any_value::Value::StringValue(cut(s)),
        AttrValue::Int(i) => any_value::Value::IntValue(*i),
        AttrValue::F64(f) => any_value::Value::DoubleValue(*f),
        AttrValue::Bool(b) => any_value::Value::BoolValue(*b),
    };
    AnyValue { value: Some(value) }
}

pub fn key_values(attrs: &[(String, AttrValue)]) -> Vec<KeyValue> {
    attrs
        .iter()
        .map(|(k, v)| KeyValue {
            key: cut(k),
            value: Some(any(v)),
            ..Default::default()
        })
        .collect()
}

/// Nanoseconds since the epoch (0 before it).
pub fn nanos(t: SystemTime) -> u64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

fn kind(k: SpanKind) -> span::SpanKind {
    match k {
        SpanKind::Internal => span::SpanKind::Internal,
        SpanKind::Server => span::SpanKind::Server,
        SpanKind::Client => span::SpanKind::Client,
        SpanKind::Producer => span::SpanKind::Producer,
        SpanKind::Consumer => span::SpanKind::Consumer,
    }
}

fn span(s: &SpanData) -> Span {
    Span {
        trace_id: s.trace_id.to_vec(),
        span_id: s.span_id.to_vec(),
        parent_span_id: s.parent.map(|p| p.to_vec()).unwrap_or_default(),
        name: cut(&s.name),
        kind: kind(s.kind) as i32,
        start_time_unix_nano: nanos(s.start),
        end_time_unix_nano: nanos(s.end.max(s.start)),
        attributes: key_values(&s.attrs),
        status: Some(match &s.error {
            Some(m) => Status {
                message: cut(m),
                code: status::StatusCode::Error as i32,
            },
            None => Status::default(),
        }),
        ..Default::default()
    }
}

/// The body of `POST /v1/traces` for `spans`.
pub fn traces_request(resource: &Resource, spans: &[SpanData]) -> Vec<u8> {
    ExportTraceServiceRequest {
        resource_spans: vec![ResourceSpans {
            resource: Some(resource.proto()),
            scope_spans: vec![ScopeSpans {
                scope: Some(scope()),
                spans: spans.iter().map(span).collect(),
                ..Default::default()
            }],
            ..Default::default()
        }],
    }
    .encode_to_vec()
}

/// The body of `POST /v1/metrics` for `metrics`.
pub fn metrics_request(resource: &Resource, metrics: Vec<Metric>) -> Vec<u8> {
    ExportMetricsServiceRequest {
        resource_metrics: vec![ResourceMetrics {
            resource: Some(resource.proto()),
            scope_metrics: vec![ScopeMetrics {
                scope: Some(scope()),
                metrics,
                ..Default::default()
            }],
            ..Default::default()
        }],
    }
    .encode_to_vec()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::telemetry::{AgentLabels, TurnCtx};

    #[test]
    fn spans_decode_with_ids_parent_times_attributes_and_status() {
        let turn = TurnCtx {
            trace_id: [7; 16],
            span_id: [3; 8],
        };
        let agent = AgentLabels::new("t/a", "t", "a", Some("ab".repeat(32)));
        let t0 = SystemTime::UNIX_EPOCH + std::time::Duration::from_millis(1_700_000_000_123);
        let mut s = SpanData::child(&turn, &agent, "execute_tool text.wordcount", t0)
            .attr("gen_ai.tool.name", "text.wordcount")
            .attr("n", 3i64)
            .attr("ok", false)
            .attr("x", 0.5);
        s.end = t0 + std::time::Duration::from_millis(20);
        s.error = Some("tool failed".into());
        let long = "é".repeat(400);
        let root = SpanData {
            parent: None,
            name: long.clone(),
            ..s.clone()
        };
        let body = traces_request(&Resource::daemon(), &[s.clone(), root]);
        let req = ExportTraceServiceRequest::decode(body.as_slice()).unwrap();
        let rs = &req.resource_spans[0];
        let res = &rs.resource.as_ref().unwrap().attributes;
        assert!(res.iter().any(|kv| kv.key == "service.name"
            && kv.value.as_ref().unwrap().value
                == Some(any_value::Value::StringValue("agentosd".into()))));
        assert!(res.iter().any(|kv| kv.key == "service.version"));
        let ss = &rs.scope_spans[0];
        assert_eq!(ss.scope.as_ref().unwrap().name, "agentosd");
        let p = &ss.spans[0];
        assert_eq!(p.trace_id, vec![7; 16]);
        assert_eq!(p.span_id, s.span_id.to_vec());
        assert_eq!(p.parent_span_id, vec![3; 8]);
        assert_eq!(p.start_time_unix_nano, 1_700_000_000_123_000_000);
        assert_eq!(p.end_time_unix_nano, 1_700_000_000_143_000_000);
        assert_eq!(p.kind, span::SpanKind::Internal as i32);
        let get = |k: &str| {
            p.attributes
                .iter()
                .find(|kv| kv.key == k)
                .and_then(|kv| kv.value.clone())
                .and_then(|v| v.value)
        };
        assert_eq!(
            get("agentos.agent"),
            Some(any_value::Value::StringValue("t/a".into()))
        );
        assert_eq!(
            get("agentos.binding"),
            Some(any_value::Value::StringValue("ab".repeat(32)))
        );
        assert_eq!(get("n"), Some(any_value::Value::IntValue(3)));
        assert_eq!(get("ok"), Some(any_value::Value::BoolValue(false)));
        assert_eq!(get("x"), Some(any_value::Value::DoubleValue(0.5)));
        let st = p.status.as_ref().unwrap();
        assert_eq!(
            (st.code, st.message.as_str()),
            (status::StatusCode::Error as i32, "tool failed")
        );
        let r = &ss.spans[1];
        assert!(r.parent_span_id.is_empty(), "a root span has no parent");
        assert!(r.name.len() <= MAX_STR && long.starts_with(&r.name));
        assert_eq!(
            r.status.as_ref().unwrap().code,
            status::StatusCode::Error as i32
        );
    }

    #[test]
    fn cut_keeps_character_boundaries() {
        assert_eq!(cut("short"), "short");
        let s = "a".repeat(MAX_STR - 1) + "é";
        assert_eq!(cut(&s), "a".repeat(MAX_STR - 1));
    }
}
