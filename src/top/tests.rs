//! Tests of `saltshaker top`: parsing, rates, rendering on buffers, the HTTP client.

use std::io::{Read, Write};

use super::http::*;
use super::parse::*;
use super::render::*;
use super::*;
use std::net::TcpListener;

const HOTKEYS: &str = r#"{"window_ms":1000,"keys":[
    {"key":"likes:1","reads_per_sec":0.0,"writes_per_sec":52000.0,"share":0.31,"state":"hot","since":1764460000000},
    {"key":"user:42:profile","reads_per_sec":9100.5,"writes_per_sec":3.0,"share":0.054,"state":"cooling","since":1764460001000}
]}"#;

const METRICS: &str = "# HELP saltshaker_requests Client commands handled, by command class.\n\
    # TYPE saltshaker_requests counter\n\
    saltshaker_requests_total{class=\"read\"} 1000\n\
    saltshaker_requests_total{class=\"write\"} 52000\n\
    saltshaker_requests_total{class=\"other\"} 7\n\
    saltshaker_requests_created{class=\"read\"} 1764460000.5\n\
    # TYPE saltshaker_backend_requests counter\n\
    saltshaker_backend_requests_total{node=\"127.0.0.1:6379\"} 40000\n\
    saltshaker_backend_requests_total{node=\"127.0.0.1:6380\"} 13000\n\
    saltshaker_client_connections 20\n\
    # EOF\n\
    saltshaker_requests_total{class=\"read\"} 99999\n";

fn view_with(keys: usize, samples: usize) -> View {
    let mut view = View {
        admin: "127.0.0.1:9901".into(),
        interval_ms: 1000,
        now_unix_ms: 45_296_000,
        ..View::default()
    };
    let snap = Snapshot {
        window_ms: 1000,
        keys: (0..keys)
            .map(|i| HotKey {
                key: format!("key:{i}:{}", "x".repeat(i * 7)),
                reads_per_sec: 100.0 * i as f64,
                writes_per_sec: 52_000.0 / (i + 1) as f64,
                bytes_per_sec: 1e6 * i as f64,
                share: 0.3 / (i + 1) as f64,
                state: if i % 2 == 0 { "hot" } else { "cooling" }.into(),
                since_unix_ms: 0,
                phase: None,
            })
            .collect(),
    };
    for s in 0..samples {
        let mut step = snap.clone();
        for k in step.keys.iter_mut() {
            k.writes_per_sec *= (s + 1) as f64;
        }
        view.history.record(&step);
    }
    let prev = parse_counters(METRICS).unwrap();
    let mut next = prev.clone();
    *next.requests.get_mut("write").unwrap() += 52_000.0;
    *next.backend.get_mut("127.0.0.1:6379").unwrap() += 39_000.0;
    *next.backend.get_mut("127.0.0.1:6380").unwrap() += 13_000.0;
    view.rates = Rates::between(&prev, &next, Duration::from_secs(1));
    view.snapshot = Some(snap);
    view.updated_unix_ms = Some(view.now_unix_ms);
    view
}

fn assert_fits(frame: &str, width: usize, height: usize) {
    let lines: Vec<&str> = frame.lines().collect();
    assert!(
        lines.len() <= height,
        "{} lines > {height}:\n{frame}",
        lines.len()
    );
    for l in lines {
        assert!(
            l.chars().count() <= width,
            "line of {} chars > {width}: {l:?}",
            l.chars().count()
        );
    }
}

#[test]
fn parse_hotkeys_reads_the_admin_json_in_order() {
    let s = parse_hotkeys(HOTKEYS).unwrap();
    assert_eq!(s.window_ms, 1000);
    assert_eq!(s.keys.len(), 2);
    assert_eq!(s.keys[0].key, "likes:1");
    assert_eq!(s.keys[0].writes_per_sec, 52000.0);
    assert_eq!(s.keys[0].since_unix_ms, 1764460000000);
    assert_eq!(s.keys[1].state, "cooling");
    assert_eq!(s.keys[1].total_per_sec(), 9103.5);
}

#[test]
fn parse_hotkeys_tolerates_missing_fields_and_rejects_non_hotkeys() {
    let s = parse_hotkeys(r#"{"keys":[{"key":"a"}],"extra":1}"#).unwrap();
    assert_eq!(
        (s.window_ms, s.keys[0].share, s.keys[0].state.as_str()),
        (0, 0.0, "hot")
    );
    assert_eq!(
        parse_hotkeys(r#"{"window_ms":1000,"keys":[]}"#)
            .unwrap()
            .keys
            .len(),
        0
    );
    assert!(parse_hotkeys("not found").is_err());
    assert!(parse_hotkeys("[1,2]").is_err());
    assert!(parse_hotkeys(r#"{"window_ms":1}"#).is_err());
    assert!(parse_hotkeys(r#"{"keys":[{"reads_per_sec":1}]}"#).is_err());
}

#[test]
fn parse_counters_reads_openmetrics_and_stops_at_eof() {
    let c = parse_counters(METRICS).unwrap();
    assert_eq!(
        c.requests.get("read"),
        Some(&1000.0),
        "sample after # EOF and _created ignored"
    );
    assert_eq!(c.requests.get("write"), Some(&52000.0));
    assert_eq!(c.requests.len(), 3);
    assert_eq!(c.backend.get("127.0.0.1:6380"), Some(&13000.0));
}

#[test]
fn parse_counters_reads_prometheus_text_without_total_suffix_and_with_timestamps() {
    let text = "saltshaker_requests{class=\"read\"} 5 1764460000000\n\
        saltshaker_requests{ class=\"write\" , shard=\"a\" } 2.5e3\n\
        saltshaker_requests{class=\"write\",shard=\"b\"} 500\n\
        saltshaker_backend_requests{node=\"[::1]:6379\"} +Inf\n\
        saltshaker_backend_requests{node=\"x\\\"y,z}\"} 3\n";
    let c = parse_counters(text).unwrap();
    assert_eq!(c.requests.get("read"), Some(&5.0));
    assert_eq!(
        c.requests.get("write"),
        Some(&3000.0),
        "samples of one class add up"
    );
    assert_eq!(
        c.backend.get("[::1]:6379"),
        None,
        "infinite values are skipped"
    );
    assert_eq!(c.backend.get("x\"y,z}"), Some(&3.0));
}

#[test]
fn parse_counters_without_request_series_is_an_error() {
    assert!(parse_counters("# EOF\n").is_err());
    assert!(parse_counters("redis_up 1\nsaltshaker_requests_total{class=\"read\" 3\n").is_err());
    assert!(parse_counters("").is_err());
}

#[test]
fn rates_come_from_counter_deltas_and_a_reset_gives_none() {
    let prev = parse_counters(METRICS).unwrap();
    let mut next = prev.clone();
    *next.requests.get_mut("read").unwrap() += 2000.0;
    *next.backend.get_mut("127.0.0.1:6380").unwrap() += 3000.0;
    next.backend.insert("127.0.0.1:6381".into(), 1000.0);
    let r = Rates::between(&prev, &next, Duration::from_secs(2)).unwrap();
    assert_eq!(r.commands_per_sec, 1000.0);
    assert_eq!(r.nodes[0], ("127.0.0.1:6380".to_string(), 1500.0));
    assert_eq!(r.nodes.len(), 3);
    assert!((r.imbalance().unwrap() - 1500.0 / (2000.0 / 3.0)).abs() < 1e-9);
    assert!(Rates::between(&next, &prev, Duration::from_secs(1)).is_none());
    assert!(Rates::between(&prev, &next, Duration::ZERO).is_none());
    assert_eq!(
        Rates::between(&prev, &prev, Duration::from_secs(1))
            .unwrap()
            .imbalance(),
        None
    );
}

#[test]
fn render_fits_80_120_and_40_columns_with_keys_in_order() {
    for width in [80, 120, 40] {
        let frame = render(&view_with(5, 10), width, 24);
        assert_fits(&frame, width, 24);
        assert!(
            frame.starts_with("saltshaker 127.0.0.1:9901 12:34:56 UTC"),
            "{frame}"
        );
        let lines: Vec<&str> = frame.lines().collect();
        let table = lines
            .iter()
            .position(|l| l.starts_with("KEY"))
            .expect("table header");
        for i in 0..5 {
            assert!(
                lines[table + 1 + i].starts_with(&format!("key:{i}:")),
                "{frame}"
            );
        }
        assert_eq!(frame.contains("TREND"), width >= 80, "width {width}");
        assert_eq!(frame.contains("STATE"), width >= 80, "width {width}");
        assert!(frame.contains("SHARE"));
    }
    let frame = render(&view_with(2, 3), 120, 24);
    assert!(
        frame.contains("cmd/s 52.0k (read 0, write 52.0k, other 0)"),
        "{frame}"
    );
    assert!(
        frame.contains("max/mean 1.50  127.0.0.1:6379 39.0k  127.0.0.1:6380 13.0k"),
        "{frame}"
    );
    assert!(
        frame.contains("1 hot, 1 cooling  window 1000 ms"),
        "{frame}"
    );
}

#[test]
fn short_keys_leave_no_gap_before_the_numbers() {
    let frame = render(&view_with(2, 3), 120, 24);
    let header = frame.lines().find(|l| l.starts_with("KEY")).unwrap();
    assert_eq!(
        header,
        format!(
            "{:<13} {:>8} {:>8} {:>8} {:>6} {:<9} TREND",
            "KEY", "READS/S", "WRITES/S", "BYTES/S", "SHARE", "STATE"
        )
    );
}

#[test]
fn a_write_hot_key_shows_its_phase_in_state() {
    let mut view = view_with(2, 3);
    if let Some(snap) = view.snapshot.as_mut() {
        snap.keys[0].phase = Some("salting".into());
        snap.keys[1].phase = Some("detected".into());
    }
    let frame = render(&view, 120, 24);
    let rows: Vec<&str> = frame.lines().filter(|l| l.starts_with("key:")).collect();
    assert!(rows[0].contains(" salting "), "{frame}");
    // "detected": nothing is done about it yet, so the detector's state shows.
    assert!(rows[1].contains(" cooling "), "{frame}");
}

#[test]
fn long_keys_are_cut_with_an_ellipsis_and_tiny_screens_are_respected() {
    let frame = render(&view_with(8, 1), 80, 24);
    assert!(frame.contains("key:7:xxxxxxxxxxxxxxxxx… "), "{frame}");
    for (w, h) in [(1, 1), (10, 3), (33, 6), (0, 0)] {
        assert_fits(&render(&view_with(8, 4), w, h), w, h);
    }
    let frame = render(&view_with(30, 1), 80, 10);
    assert_fits(&frame, 80, 10);
    assert!(frame.ends_with("... 26 more"), "{frame}");
}

#[test]
fn sparkline_grows_with_history_newest_at_the_right() {
    let trend = |samples: usize| {
        let frame = render(&view_with(1, samples), 120, 24);
        let row = frame
            .lines()
            .find(|l| l.starts_with("key:0:"))
            .unwrap()
            .to_string();
        row.chars().filter(|c| BLOCKS.contains(c)).count()
    };
    assert_eq!(trend(1), 1);
    assert_eq!(trend(5), 5);
    assert_eq!(trend(HISTORY_LEN + 10), HISTORY_LEN);
    assert_eq!(sparkline(&[1.0, 2.0, 4.0, 8.0], 6), "  ▁▂▄█");
    assert_eq!(sparkline(&[0.0, 3.0], 2), " █");
    assert_eq!(sparkline(&[], 3), "   ");
}

#[test]
fn history_forgets_keys_that_stay_quiet() {
    let mut h = History::default();
    let snap = parse_hotkeys(HOTKEYS).unwrap();
    h.record(&snap);
    h.record(&Snapshot::default());
    assert_eq!(h.samples("likes:1"), &[52000.0, 0.0]);
    for _ in 0..HISTORY_LEN {
        h.record(&Snapshot::default());
    }
    assert!(h.samples("likes:1").is_empty());
}

#[test]
fn empty_and_error_states_say_so() {
    let mut view = view_with(0, 0);
    let frame = render(&view, 80, 24);
    assert!(frame.contains("no hot keys"), "{frame}");
    assert!(!frame.contains("KEY"));
    view.error = Some("127.0.0.1:9901: Connection refused (os error 111)".into());
    let frame = render(&view, 80, 24);
    assert!(
        frame.contains("\nerror: Connection refused (os error 111)\n"),
        "{frame}"
    );
    assert!(frame.contains("showing data from 12:34:56 UTC"), "{frame}");
    let fresh = View {
        admin: "h:1".into(),
        error: view.error.clone(),
        ..View::default()
    };
    let frame = render(&fresh, 40, 24);
    assert_fits(&frame, 40, 24);
    assert!(frame.contains("waiting for the admin port"), "{frame}");
}

#[test]
fn control_characters_in_keys_never_reach_the_terminal() {
    let mut view = view_with(1, 1);
    view.snapshot.as_mut().unwrap().keys[0].key = "evil\x1b[2J\r\nkey".into();
    let frame = render(&view, 80, 24);
    assert!(!frame.contains('\x1b') && !frame.contains('\r'));
    assert!(frame.contains("evil?[2J??key"), "{frame}");
}

#[test]
fn http_answers_are_checked_and_dechunked() {
    let get = |answer: fn(&str) -> String| {
        http_get(
            &fake_admin(1, answer),
            "/metrics",
            None,
            Duration::from_secs(2),
        )
    };
    let ok = get(|_| "HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nhello".into());
    assert_eq!(ok.unwrap(), "hello");
    let chunked = get(|_| {
        "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2;x=y\r\nde\r\n0\r\n\r\n"
            .into()
    });
    assert_eq!(chunked.unwrap(), "abcde");
    let e = get(|_| {
        "HTTP/1.1 404 Not Found\r\ncontent-length: 24\r\n\r\nnot found: try /metrics\n".into()
    })
    .unwrap_err()
    .to_string();
    assert!(
        e.ends_with("/metrics: HTTP 404 Not Found: not found: try /metrics"),
        "{e}"
    );
    assert!(get(|_| String::new()).is_err(), "closed without an answer");
    assert!(get(|_| "SSH-2.0-OpenSSH\r\n\r\n".into()).is_err());
    assert!(
        get(|_| "HTTP/1.1 200 OK\r\ncontent-length: 9\r\n\r\nshort".into()).is_err(),
        "shorter than its Content-Length"
    );
    assert!(get(|_| "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n".into()).is_err());
}

/// An admin port stand-in: answers each connection from `route`, `n` times.
fn fake_admin(n: usize, route: fn(&str) -> String) -> String {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap().to_string();
    std::thread::spawn(move || {
        for s in l.incoming().take(n) {
            let mut s = s.unwrap();
            let mut req = Vec::new();
            let mut b = [0u8; 1024];
            while !req.windows(4).any(|w| w == b"\r\n\r\n") {
                let k = s.read(&mut b).unwrap();
                req.extend_from_slice(&b[..k]);
            }
            let path = String::from_utf8_lossy(&req)
                .split(' ')
                .nth(1)
                .unwrap_or("")
                .to_string();
            let _ = s.write_all(route(&path).as_bytes());
        }
    });
    addr
}

#[test]
fn poller_reads_a_live_admin_port_and_reports_one_that_is_gone() {
    let addr = fake_admin(4, |path| {
        let body = if path == "/hotkeys" { HOTKEYS } else { METRICS };
        format!(
            "HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        )
    });
    let mut p = Poller::new(&addr, 500);
    assert!(p.poll().error.is_none(), "{:?}", p.view().error);
    assert!(p.view().rates.is_none(), "one sample gives no rate");
    let v = p.poll();
    assert!(v.error.is_none());
    assert_eq!(v.rates.as_ref().unwrap().commands_per_sec, 0.0);
    assert_eq!(v.history.samples("likes:1").len(), 2);
    let frame = render(v, 80, 24);
    assert!(
        frame.contains("likes:1") && frame.contains("52.0k"),
        "{frame}"
    );

    // The fake server has answered its 4 requests and is gone.
    let v = p.poll();
    assert!(
        v.error.as_deref().unwrap_or("").contains(&addr),
        "{:?}",
        v.error
    );
    assert!(v.snapshot.is_some(), "the last good sample stays on screen");
    assert!(v.rates.is_none());
}

#[test]
fn a_non_saltshaker_port_is_an_error_not_a_blank_screen() {
    let addr = fake_admin(1, |_| {
        "HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nhello".to_string()
    });
    let mut p = Poller::new(&addr, 500);
    let e = p.poll().error.clone().unwrap_or_default();
    assert!(e.contains("no saltshaker_requests_total"), "{e}");
}

#[test]
fn a_silent_server_times_out() {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap().to_string();
    let started = Instant::now();
    let e = http_get(&addr, "/metrics", None, Duration::from_millis(200))
        .unwrap_err()
        .to_string();
    assert!(e.contains("no answer within 200 ms"), "{e}");
    assert!(started.elapsed() < Duration::from_secs(2));
    drop(l);
}

#[test]
fn sort_by_bytes_orders_rows_by_what_their_reads_move() {
    let mut view = view_with(4, 3);
    // view_with gives key i 1e6 * i bytes/s: by rate key:0 leads, by bytes key:3.
    let by_rate: Vec<String> = render(&view, 120, 24)
        .lines()
        .filter(|l| l.starts_with("key:"))
        .map(|l| l[..5].to_string())
        .collect();
    assert_eq!(by_rate, ["key:0", "key:1", "key:2", "key:3"]);
    view.sort_by_bytes = true;
    let frame = render(&view, 120, 24);
    let by_bytes: Vec<String> = frame
        .lines()
        .filter(|l| l.starts_with("key:"))
        .map(|l| l[..5].to_string())
        .collect();
    assert_eq!(by_bytes, ["key:3", "key:2", "key:1", "key:0"]);
    assert!(frame.contains("BYTES/S"), "{frame}");
    assert!(frame.contains("3.00M"), "{frame}");
}
