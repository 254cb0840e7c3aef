//! probe
#[cfg(test)]
mod tests {
    use serde::Deserialize;
    #[derive(Deserialize, Debug)]
    #[serde(deny_unknown_fields)]
    struct W { strategy: Option<String> }
    #[derive(Deserialize, Debug)]
    #[serde(deny_unknown_fields)]
    struct R { #[serde(rename = "match")] m: String, write: Option<W> }
    #[derive(Deserialize, Debug)]
    #[serde(deny_unknown_fields)]
    struct D { version: u32, rules: Vec<R> }
    #[test]
    fn probe() {
        for t in [
            "version: 1\nrules:\n  - match: a\n  - match: b\n    write: { strategyy: salt }\n",
            "version: 1\nrules:\n  - match: a\n  - match: b\n    write:\n      strategyy: salt\n",
            "version: x\nrules: []\n",
            "version: 1\nversion: 2\nrules: []\n",
            "rules: []\n",
        ] {
            let e = crate::config::parse_yaml::<D>(t, "f.yaml").unwrap_err();
            println!("{e:?}");
        }
    }
}
