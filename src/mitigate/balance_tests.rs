use super::*;

fn cfg() -> Balance {
    Balance::default()
}

fn key(s: &str) -> Box<[u8]> {
    s.as_bytes().into()
}

/// `n` cold keys named `{p}{i}` with Zipf-like rates, the first at `top` reads/s.
fn zipf(p: &str, top: f64, n: usize) -> Vec<(Box<[u8]>, f64)> {
    (1..=n)
        .map(|i| (key(&format!("{p}{i}")), top / (i as f64).powf(1.1)))
        .collect()
}

fn cold(rates: Vec<(Box<[u8]>, f64)>) -> NodeKeys {
    NodeKeys {
        cold: rates,
        chosen: Vec::new(),
    }
}

#[test]
fn an_even_load_chooses_nothing() {
    let mut c = Controller::new(4);
    let keys = vec![cold(zipf("k", 500.0, 100)); 4];
    let ch = c.step(&[Some(1000.0); 4], &keys, &cfg(), false);
    assert!(!c.deep());
    assert!(ch.iter().all(|c| *c == Change::None));
}

#[test]
fn a_busy_node_gets_its_hottest_keys_chosen_as_many_as_take_its_excess_off() {
    let mut c = Controller::new(4);
    let rates = zipf("a", 1000.0, 1000);
    let keys = vec![
        cold(rates.clone()),
        cold(vec![]),
        cold(vec![]),
        cold(vec![]),
    ];
    let loads = [Some(3000.0), Some(1000.0), Some(1000.0), Some(1000.0)];
    let ch = c.step(&loads, &keys, &cfg(), false);
    assert_eq!(ch[0], Change::Started);
    let count = c.chosen[0].len();
    let after = |m: usize| {
        let taken: f64 = rates[..m].iter().map(|r| r.1).sum();
        (3000.0 - taken) / (1500.0 - taken / 4.0)
    };
    assert!(
        after(count) <= 1.05,
        "{count} keys leave {:.3}",
        after(count)
    );
    assert!(after(count - 1) > 1.05, "one key fewer would not have done");
    assert!((1..=count).all(|i| c.chosen[0].contains(&key(&format!("a{i}")))));
    assert!(c.chosen[1].is_empty());
    // The next step waits for the load to show the change.
    let keys = vec![
        NodeKeys {
            cold: rates[count..].to_vec(),
            chosen: rates[..count].to_vec(),
        },
        cold(vec![]),
        cold(vec![]),
        cold(vec![]),
    ];
    c.step(&loads, &keys, &cfg(), false);
    assert_eq!(c.chosen[0].len(), count);
}

#[test]
fn some_of_many_keys_read_alike_are_chosen_and_a_whole_node_is_never_taken() {
    let mut c = Controller::new(2);
    // 20 keys at 50/s on a node 300/s over the other: 6 of them bring it to the mean
    // (1000 against 1000).
    let flat: Vec<(Box<[u8]>, f64)> = (0..20).map(|i| (key(&format!("f{i}")), 50.0)).collect();
    let keys = vec![cold(flat), cold(vec![])];
    c.step(&[Some(1300.0), Some(1000.0)], &keys, &cfg(), false);
    assert_eq!(c.chosen[0].len(), 6);
    // A node whose whole load is one key: taking it would only move the skew (the node
    // would be at 0, further from a mean of 350 than it is now from 1000).
    let mut c = Controller::new(2);
    let keys = vec![cold(vec![(key("x"), 1300.0)]), cold(vec![])];
    c.step(&[Some(1300.0), Some(700.0)], &keys, &cfg(), false);
    assert!(c.chosen[0].is_empty());
}

#[test]
fn no_key_worth_caching_chooses_none_and_a_full_view_asks_for_more_keys() {
    let mut c = Controller::new(2);
    let keys = vec![cold(vec![(key("a"), 3.0), (key("b"), 2.0)]), cold(vec![])];
    let loads = [Some(3000.0), Some(1000.0)];
    c.step(&loads, &keys, &cfg(), false);
    assert!(!c.deep(), "uneven placement, no warm key: nothing to do");
    let keys = vec![cold(vec![]), cold(vec![])];
    c.step(&loads, &keys, &cfg(), true);
    assert!(c.chosen[0].is_empty());
    assert!(c.deep(), "keys at >= the floor fill the view: track more");
}

#[test]
fn a_node_over_by_less_than_one_floor_key_is_left_alone() {
    let mut c = Controller::new(2);
    let keys = vec![cold(zipf("k", 50.0, 10)); 2];
    // 10% over the mean, but by 10 commands/s: no key at >= 20/s can fix that.
    c.step(&[Some(110.0), Some(90.0)], &keys, &cfg(), false);
    assert!(c.chosen.iter().all(HashSet::is_empty));
}

#[test]
fn inside_the_band_keys_stay_and_below_it_the_coolest_go_back() {
    let mut c = Controller::new(2);
    let chosen: Vec<(Box<[u8]>, f64)> = [400.0, 300.0, 200.0, 150.0, 100.0]
        .iter()
        .map(|r| (key(&format!("c{r}")), *r))
        .collect();
    c.chosen[0] = chosen.iter().map(|(k, _)| k.clone()).collect();
    let keys = vec![
        NodeKeys {
            cold: vec![(key("x"), 90.0)],
            chosen: chosen.clone(),
        },
        cold(vec![]),
    ];
    c.step(&[Some(1020.0), Some(1000.0)], &keys, &cfg(), false);
    assert_eq!(c.chosen[0].len(), 5, "within 5%: hold");
    // Mean 1000, node 0 at 700: giving back 100 + 150 + 200 leaves it at 1150 / 1225
    // of the mean; adding the 300 key would put it over (1450 / 1375).
    let ch = c.step(&[Some(700.0), Some(1300.0)], &keys, &cfg(), false);
    assert_eq!(ch[0], Change::None);
    let mut left: Vec<&[u8]> = c.chosen[0].iter().map(|k| &k[..]).collect();
    left.sort();
    assert_eq!(left, vec![&b"c300"[..], b"c400"]);
    // Room for every chosen key: all go back.
    c.held[0] = 0;
    let ch = c.step(&[Some(10.0), Some(5000.0)], &keys, &cfg(), false);
    assert_eq!(ch[0], Change::Ended);
    assert!(!c.deep());
}

#[test]
fn chosen_keys_no_longer_reported_are_forgotten() {
    let mut c = Controller::new(2);
    c.chosen[0].insert(key("gone"));
    let ch = c.step(&[Some(1000.0), Some(1000.0)], &[], &cfg(), false);
    assert_eq!(ch[0], Change::Ended);
    assert!(c.chosen[0].is_empty());
}

#[test]
fn a_down_node_gives_its_keys_back_and_leaves_the_mean() {
    let mut c = Controller::new(3);
    c.chosen[0].insert(key("a"));
    let ch = c.step(&[None, Some(1000.0), Some(1000.0)], &[], &cfg(), false);
    assert_eq!(ch[0], Change::Ended);
    assert!(!c.deep());
}

#[test]
fn disabled_gives_every_key_back() {
    let mut c = Controller::new(2);
    c.chosen[0].insert(key("a"));
    c.chosen[1].insert(key("b"));
    let off = Balance {
        enabled: false,
        ..cfg()
    };
    c.step(&[Some(5000.0), Some(10.0)], &[], &off, false);
    assert!(c.chosen.iter().all(HashSet::is_empty));
}

#[test]
fn chosen_keys_are_read_hot_from_the_floor() {
    let chosen = Chosen::default();
    assert_eq!(chosen.lowest(), f64::INFINITY);
    chosen.set([key("b")].into_iter().collect(), 20.0);
    assert_eq!(chosen.apply(b"a", 2000.0, 500.0), (2000.0, 500.0));
    assert_eq!(chosen.apply(b"b", 2000.0, 500.0), (20.0, 5.0));
    // A rule that is already lower keeps its own thresholds.
    assert_eq!(chosen.apply(b"b", 10.0, 2.0), (10.0, 2.0));
    assert_eq!(chosen.lowest(), 20.0);
}

#[test]
fn node_keys_splits_by_node_and_skips_hot_and_uncached_keys() {
    use crate::hotkey::{HotKey, HotState};
    let hot = |k: &str| HotKey {
        key: k.as_bytes().to_vec(),
        reads_per_sec: 3000.0,
        writes_per_sec: 0.0,
        share: 0.1,
        state: HotState::Hot,
        since_unix_ms: 0,
        read_state: Some(HotState::Hot),
        write_state: None,
        ..Default::default()
    };
    let snap = HotSnapshot {
        keys: vec![hot("a0"), hot("a1")],
        read_rates: Arc::new(vec![
            (key("a0"), 3000.0),
            (key("a1"), 300.0),
            (key("b1"), 200.0),
            (key("a2"), 100.0),
            (key("lock"), 90.0),
        ]),
        ..Default::default()
    };
    let chosen: HashSet<Box<[u8]>> = [key("a1")].into_iter().collect();
    let k = node_keys(
        &snap,
        2,
        &chosen,
        |k| usize::from(k[0] == b'b'),
        |k| k != b"lock",
    );
    assert_eq!(k[0].chosen, vec![(key("a1"), 300.0)]);
    assert_eq!(
        k[0].cold,
        vec![(key("a2"), 100.0)],
        "a0 is hot by the rules"
    );
    assert_eq!(k[1].cold, vec![(key("b1"), 200.0)]);
}
