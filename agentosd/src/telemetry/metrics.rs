//! Per-agent metrics: what the supervisor samples (CPU, memory, tasks, denials) and what the
//! daemon counts as calls pass (tool calls and their latency, tokens), as OTLP metrics with
//! cumulative temporality. Bounded: series for at most `max_agents` agents, 64 tools and 16
//! models per agent (more are counted under "other").

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, SystemTime};

use opentelemetry_proto::tonic::common::v1::KeyValue;
use opentelemetry_proto::tonic::metrics::v1::{
    AggregationTemporality, Gauge, Histogram, HistogramDataPoint, Metric, NumberDataPoint, Sum,
    metric, number_data_point,
};

use super::otlp::{key_values, nanos};
use super::{AgentLabels, AttrValue, TelemetryStats};

const MAX_TOOLS: usize = 64;
const MAX_MODELS: usize = 16;
const OTHER: &str = "other";

/// Tool-call latency buckets, seconds (OTel's default for durations).
const DURATION_BOUNDS: &[f64] = &[
    0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
];
/// Token count buckets of `gen_ai.client.token.usage` (the GenAI semantic conventions').
const TOKEN_BOUNDS: &[f64] = &[
    1.0, 4.0, 16.0, 64.0, 256.0, 1024.0, 4096.0, 16384.0, 65536.0, 262144.0, 1048576.0, 4194304.0,
    16777216.0, 67108864.0,
];

/// One agent as the supervisor saw it when sampling.
#[derive(Debug, Clone, PartialEq)]
pub struct AgentSample {
    pub labels: AgentLabels,
    /// When its current run started (its cgroup counters start there).
    pub since: SystemTime,
    /// cgroup `cpu.stat` usage_usec (None: the cpu controller is not enabled).
    pub cpu_usage_usec: Option<u64>,
    /// cgroup `memory.current`.
    pub memory_current: Option<u64>,
    /// cgroup `pids.current` (or the processes counted).
    pub tasks_current: u64,
    /// Kernel denials since the daemon started.
    pub denials: u64,
}

/// How a tool call ended, for `agentos.agent.tool.calls`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum ToolOutcome {
    /// Ran and answered.
    Ok,
    /// Ran and failed (tool error, timeout, bad arguments).
    Error,
    /// Refused by the gate (unknown tool, not granted, denied).
    Refused,
    /// Consent refused, expired or withdrawn.
    ConsentRefused,
    /// Cancelled by the agent.
    Cancelled,
    /// Refused because the audit trail could not record it.
    Unavailable,
}

impl ToolOutcome {
    pub fn as_str(self) -> &'static str {
        match self {
            ToolOutcome::Ok => "ok",
            ToolOutcome::Error => "error",
            ToolOutcome::Refused => "refused",
            ToolOutcome::ConsentRefused => "consent-refused",
            ToolOutcome::Cancelled => "cancelled",
            ToolOutcome::Unavailable => "unavailable",
        }
    }
}

/// An explicit-bucket histogram.
#[derive(Debug, Clone)]
struct Hist {
    bounds: &'static [f64],
    counts: Vec<u64>,
    count: u64,
    sum: f64,
    min: f64,
    max: f64,
}

impl Hist {
    fn new(bounds: &'static [f64]) -> Hist {
        Hist {
            bounds,
            counts: vec![0; bounds.len() + 1],
            count: 0,
            sum: 0.0,
            min: f64::INFINITY,
            max: f64::NEG_INFINITY,
        }
    }

    fn add(&mut self, v: f64) {
        let i = self.bounds.partition_point(|b| *b < v);
        self.counts[i] += 1;
        self.count += 1;
        self.sum += v;
        self.min = self.min.min(v);
        self.max = self.max.max(v);
    }

    fn point(
        &self,
        attrs: Vec<KeyValue>,
        start: SystemTime,
        now: SystemTime,
    ) -> HistogramDataPoint {
        HistogramDataPoint {
            attributes: attrs,
            start_time_unix_nano: nanos(start),
            time_unix_nano: nanos(now),
            count: self.count,
            sum: Some(self.sum),
            bucket_counts: self.counts.clone(),
            explicit_bounds: self.bounds.to_vec(),
            min: (self.count > 0).then_some(self.min),
            max: (self.count > 0).then_some(self.max),
            ..Default::default()
        }
    }
}

/// What the daemon counted for one agent.
#[derive(Debug)]
struct AgentSeries {
    labels: AgentLabels,
    since: SystemTime,
    calls: BTreeMap<ToolOutcome, u64>,
    tools: BTreeMap<String, Hist>,
    /// Model → (input tokens, output tokens) per call.
    tokens: BTreeMap<String, (Hist, Hist)>,
}

/// The counted series of all agents.
#[derive(Debug)]
pub struct Series {
    agents: HashMap<String, AgentSeries>,
    /// Agents that stopped: their series go once they were exported one last time (a
    /// short-lived agent's calls and tokens still reach the collector).
    ended: std::collections::HashSet<String>,
    max_agents: usize,
    /// When counting began (the start of the daemon-wide cumulative sums).
    created: SystemTime,
}

impl Series {
    pub fn new(max_agents: usize) -> Series {
        Series {
            agents: HashMap::new(),
            ended: Default::default(),
            max_agents: max_agents.max(1),
            created: SystemTime::now(),
        }
    }

    fn agent(&mut self, labels: &AgentLabels, now: SystemTime) -> Option<&mut AgentSeries> {
        // Active again before its last export: it stays.
        self.ended.remove(&labels.id);
        if !self.agents.contains_key(&labels.id) && self.agents.len() >= self.max_agents {
            return None;
        }
        let s = self
            .agents
            .entry(labels.id.clone())
            .or_insert_with(|| AgentSeries {
                labels: labels.clone(),
                since: now,
                calls: BTreeMap::new(),
                tools: BTreeMap::new(),
                tokens: BTreeMap::new(),
            });
        if s.labels != *labels {
            s.labels = labels.clone();
        }
        Some(s)
    }

    pub fn tool_call(
        &mut self,
        labels: &AgentLabels,
        tool: &str,
        outcome: ToolOutcome,
        took: Option<Duration>,
        now: SystemTime,
    ) {
        let Some(s) = self.agent(labels, now) else {
            return;
        };
        *s.calls.entry(outcome).or_default() += 1;
        if let Some(d) = took {
            let key = if s.tools.contains_key(tool) || s.tools.len() < MAX_TOOLS {
                tool
            } else {
                OTHER
            };
            s.tools
                .entry(key.to_string())
                .or_insert_with(|| Hist::new(DURATION_BOUNDS))
                .add(d.as_secs_f64());
        }
    }

    pub fn tokens(
        &mut self,
        labels: &AgentLabels,
        model: &str,
        prompt: u64,
        completion: u64,
        now: SystemTime,
    ) {
        let Some(s) = self.agent(labels, now) else {
            return;
        };
        let key = if s.tokens.contains_key(model) || s.tokens.len() < MAX_MODELS {
            super::otlp::cut(model)
        } else {
            OTHER.to_string()
        };
        let (i, o) = s
            .tokens
            .entry(key)
            .or_insert_with(|| (Hist::new(TOKEN_BOUNDS), Hist::new(TOKEN_BOUNDS)));
        i.add(prompt as f64);
        o.add(completion as f64);
    }

    /// The agent stopped: its series are exported once more, then dropped ([`Series::sweep`]).
    pub fn forget(&mut self, agent_id: &str) {
        if self.agents.contains_key(agent_id) {
            self.ended.insert(agent_id.to_string());
        }
    }

    /// Drop the series of the agents that stopped before the export that just happened.
    pub fn sweep(&mut self) {
        for id in std::mem::take(&mut self.ended) {
            self.agents.remove(&id);
        }
    }

    /// Every metric now: the agents' samples, the counted series, telemetry's own counts.
    pub fn metrics(
        &self,
        samples: &[AgentSample],
        stats: &TelemetryStats,
        now: SystemTime,
    ) -> Vec<Metric> {
        let mut b = Builder::default();
        for a in samples {
            let attrs = key_values(&a.labels.attrs());
            if let Some(u) = a.cpu_usage_usec {
                let v = number_data_point::Value::AsDouble(u as f64 / 1e6);
                b.sum(
                    "agentos.agent.cpu.time",
                    "s",
                    "CPU time of the agent's cgroup (cpu.stat usage_usec)",
                    attrs.clone(),
                    a.since,
                    now,
                    v,
                );
            }
            if let Some(m) = a.memory_current {
                let v = number_data_point::Value::AsInt(i64_of(m));
                b.gauge(
                    "agentos.agent.memory.usage",
                    "By",
                    "Memory of the agent's cgroup (memory.current)",
                    attrs.clone(),
                    now,
                    v,
                );
            }
            let v = number_data_point::Value::AsInt(i64_of(a.tasks_current));
            b.gauge(
                "agentos.agent.tasks",
                "{task}",
                "Tasks in the agent's cgroup (pids.current)",
                attrs.clone(),
                now,
                v,
            );
            let v = number_data_point::Value::AsInt(i64_of(a.denials));
            b.sum(
                "agentos.agent.denials",
                "{denial}",
                "Kernel denials of the agent (Landlock, seccomp, cgroup BPF, BPF LSM)",
                attrs,
                self.created,
                now,
                v,
            );
        }
        for s in self.agents.values() {
            self.series_metrics(&mut b, s, now);
        }
        for (name, v) in [
            (
                "agentos.telemetry.spans.dropped",
                stats.queue_full + stats.export_failed,
            ),
            ("agentos.telemetry.spans.exported", stats.exported),
        ] {
            let v = number_data_point::Value::AsInt(i64_of(v));
            b.sum(
                name,
                "{span}",
                "Spans of agentosd's OpenTelemetry export",
                Vec::new(),
                self.created,
                now,
                v,
            );
        }
        b.done()
    }

    fn series_metrics(&self, b: &mut Builder, s: &AgentSeries, now: SystemTime) {
        let base = s.labels.attrs();
        let with = |k: &str, v: &str| {
            let mut a = base.clone();
            a.push((k.to_string(), AttrValue::from(v)));
            a
        };
        for (outcome, n) in &s.calls {
            let attrs = key_values(&with("agentos.tool.outcome", outcome.as_str()));
            let v = number_data_point::Value::AsInt(i64_of(*n));
            b.sum(
                "agentos.agent.tool.calls",
                "{call}",
                "Tool calls of the agent, by outcome",
                attrs,
                s.since,
                now,
                v,
            );
        }
        for (tool, h) in &s.tools {
            let p = h.point(key_values(&with("gen_ai.tool.name", tool)), s.since, now);
            b.hist(
                "agentos.agent.tool.duration",
                "s",
                "Duration of the agent's tool calls that ran",
                p,
            );
        }
        for (model, (i, o)) in &s.tokens {
            for (kind, h) in [("input", i), ("output", o)] {
                let mut a = with("gen_ai.request.model", model);
                a.push(("gen_ai.token.type".into(), kind.into()));
                a.push(("gen_ai.operation.name".into(), "chat".into()));
                let p = h.point(key_values(&a), s.since, now);
                b.hist(
                    "gen_ai.client.token.usage",
                    "{token}",
                    "Tokens per model call of the agent",
                    p,
                );
            }
        }
    }
}

fn i64_of(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// Metrics by name, each with its points.
#[derive(Default)]
struct Builder {
    order: Vec<String>,
    by_name: HashMap<String, Metric>,
}

impl Builder {
    fn metric(&mut self, name: &str, unit: &str, desc: &str, empty: metric::Data) -> &mut Metric {
        if !self.by_name.contains_key(name) {
            self.order.push(name.to_string());
        }
        self.by_name
            .entry(name.to_string())
            .or_insert_with(|| Metric {
                name: name.into(),
                unit: unit.into(),
                description: desc.into(),
                data: Some(empty),
                ..Default::default()
            })
    }

    #[allow(clippy::too_many_arguments)]
    fn sum(
        &mut self,
        name: &str,
        unit: &str,
        desc: &str,
        attrs: Vec<KeyValue>,
        start: SystemTime,
        now: SystemTime,
        v: number_data_point::Value,
    ) {
        let empty = metric::Data::Sum(Sum {
            data_points: Vec::new(),
            aggregation_temporality: AggregationTemporality::Cumulative as i32,
            is_monotonic: true,
        });
        if let Some(metric::Data::Sum(s)) = &mut self.metric(name, unit, desc, empty).data {
            s.data_points.push(point(attrs, Some(start), now, v));
        }
    }

    fn gauge(
        &mut self,
        name: &str,
        unit: &str,
        desc: &str,
        attrs: Vec<KeyValue>,
        now: SystemTime,
        v: number_data_point::Value,
    ) {
        let empty = metric::Data::Gauge(Gauge {
            data_points: Vec::new(),
        });
        if let Some(metric::Data::Gauge(g)) = &mut self.metric(name, unit, desc, empty).data {
            g.data_points.push(point(attrs, None, now, v));
        }
    }

    fn hist(&mut self, name: &str, unit: &str, desc: &str, p: HistogramDataPoint) {
        let empty = metric::Data::Histogram(Histogram {
            data_points: Vec::new(),
            aggregation_temporality: AggregationTemporality::Cumulative as i32,
        });
        if let Some(metric::Data::Histogram(h)) = &mut self.metric(name, unit, desc, empty).data {
            h.data_points.push(p);
        }
    }

    fn done(mut self) -> Vec<Metric> {
        self.order
            .iter()
            .filter_map(|n| self.by_name.remove(n))
            .collect()
    }
}

fn point(
    attrs: Vec<KeyValue>,
    start: Option<SystemTime>,
    now: SystemTime,
    v: number_data_point::Value,
) -> NumberDataPoint {
    NumberDataPoint {
        attributes: attrs,
        start_time_unix_nano: start.map(nanos).unwrap_or(0),
        time_unix_nano: nanos(now),
        value: Some(v),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn agent(id: &str) -> AgentLabels {
        let (t, n) = id.split_once('/').unwrap_or(("default", id));
        AgentLabels::new(id, t, n, Some("ab".repeat(32)))
    }

    fn find<'a>(ms: &'a [Metric], name: &str) -> &'a Metric {
        ms.iter().find(|m| m.name == name).unwrap_or_else(|| {
            panic!(
                "no metric {name} in {:?}",
                ms.iter().map(|m| &m.name).collect::<Vec<_>>()
            )
        })
    }

    fn has_attr(kvs: &[KeyValue], k: &str, v: &str) -> bool {
        kvs.iter().any(|kv| {
            kv.key == k
                && kv.value.as_ref().and_then(|v| v.value.clone())
                    == Some(
                        opentelemetry_proto::tonic::common::v1::any_value::Value::StringValue(
                            v.into(),
                        ),
                    )
        })
    }

    #[test]
    fn histograms_bucket_by_upper_bound() {
        let mut h = Hist::new(DURATION_BOUNDS);
        for v in [0.001, 0.005, 0.0051, 20.0] {
            h.add(v);
        }
        assert_eq!(h.counts[0], 2, "≤ 0.005 is the first bucket");
        assert_eq!(h.counts[1], 1);
        assert_eq!(*h.counts.last().unwrap(), 1, "over the last bound");
        assert_eq!((h.count, h.min, h.max), (4, 0.001, 20.0));
    }

    #[test]
    fn samples_and_series_become_per_agent_metrics() {
        let now = SystemTime::now();
        let mut s = Series::new(8);
        let a = agent("t/a");
        s.tool_call(
            &a,
            "text.wordcount",
            ToolOutcome::Ok,
            Some(Duration::from_millis(30)),
            now,
        );
        s.tool_call(
            &a,
            "text.wordcount",
            ToolOutcome::Ok,
            Some(Duration::from_millis(70)),
            now,
        );
        s.tool_call(&a, "clock.now", ToolOutcome::Refused, None, now);
        s.tokens(&a, "smollm2", 12, 30, now);
        let sample = AgentSample {
            labels: a.clone(),
            since: now,
            cpu_usage_usec: Some(1_500_000),
            memory_current: Some(4096),
            tasks_current: 3,
            denials: 2,
        };
        let stats = TelemetryStats {
            queue_full: 1,
            export_failed: 2,
            exported: 5,
            metrics_failed: 0,
        };
        let ms = s.metrics(&[sample], &stats, now);
        let Some(metric::Data::Sum(cpu)) = &find(&ms, "agentos.agent.cpu.time").data else {
            panic!()
        };
        assert!(cpu.is_monotonic);
        assert_eq!(
            cpu.data_points[0].value,
            Some(number_data_point::Value::AsDouble(1.5))
        );
        assert!(has_attr(
            &cpu.data_points[0].attributes,
            "agentos.agent",
            "t/a"
        ));
        assert!(has_attr(
            &cpu.data_points[0].attributes,
            "agentos.binding",
            &"ab".repeat(32)
        ));
        let Some(metric::Data::Gauge(mem)) = &find(&ms, "agentos.agent.memory.usage").data else {
            panic!()
        };
        assert_eq!(
            mem.data_points[0].value,
            Some(number_data_point::Value::AsInt(4096))
        );
        let Some(metric::Data::Gauge(t)) = &find(&ms, "agentos.agent.tasks").data else {
            panic!()
        };
        assert_eq!(
            t.data_points[0].value,
            Some(number_data_point::Value::AsInt(3))
        );
        let Some(metric::Data::Sum(d)) = &find(&ms, "agentos.agent.denials").data else {
            panic!()
        };
        assert_eq!(
            d.data_points[0].value,
            Some(number_data_point::Value::AsInt(2))
        );
        let Some(metric::Data::Sum(calls)) = &find(&ms, "agentos.agent.tool.calls").data else {
            panic!()
        };
        assert_eq!(calls.data_points.len(), 2, "ok and refused");
        let ok = calls
            .data_points
            .iter()
            .find(|p| has_attr(&p.attributes, "agentos.tool.outcome", "ok"))
            .unwrap();
        assert_eq!(ok.value, Some(number_data_point::Value::AsInt(2)));
        let Some(metric::Data::Histogram(dur)) = &find(&ms, "agentos.agent.tool.duration").data
        else {
            panic!()
        };
        assert_eq!(
            dur.data_points.len(),
            1,
            "only calls that ran have a duration"
        );
        assert_eq!(dur.data_points[0].count, 2);
        assert!((dur.data_points[0].sum.unwrap() - 0.1).abs() < 1e-9);
        assert!(has_attr(
            &dur.data_points[0].attributes,
            "gen_ai.tool.name",
            "text.wordcount"
        ));
        let Some(metric::Data::Histogram(tok)) = &find(&ms, "gen_ai.client.token.usage").data
        else {
            panic!()
        };
        let input = tok
            .data_points
            .iter()
            .find(|p| has_attr(&p.attributes, "gen_ai.token.type", "input"))
            .unwrap();
        assert_eq!((input.count, input.sum), (1, Some(12.0)));
        let Some(metric::Data::Sum(dropped)) = &find(&ms, "agentos.telemetry.spans.dropped").data
        else {
            panic!()
        };
        assert_eq!(
            dropped.data_points[0].value,
            Some(number_data_point::Value::AsInt(3))
        );
    }

    #[test]
    fn series_are_bounded_per_agent_and_in_agents() {
        let now = SystemTime::now();
        let mut s = Series::new(2);
        for i in 0..3 {
            s.tool_call(&agent(&format!("t/a{i}")), "x", ToolOutcome::Ok, None, now);
        }
        assert_eq!(s.agents.len(), 2, "the third agent gets no series");
        let a = agent("t/a0");
        for i in 0..(MAX_TOOLS + 5) {
            s.tool_call(
                &a,
                &format!("tool{i}"),
                ToolOutcome::Ok,
                Some(Duration::from_millis(1)),
                now,
            );
        }
        let tools = &s.agents["t/a0"].tools;
        assert_eq!(tools.len(), MAX_TOOLS + 1);
        assert_eq!(tools[OTHER].count, 5);
        s.forget("t/a0");
        // Exported once more, then gone.
        assert!(s.agents.contains_key("t/a0"));
        let _ = s.metrics(&[], &TelemetryStats::default(), now);
        s.sweep();
        assert!(!s.agents.contains_key("t/a0"));
    }
}
