//! A rules file's value that parses but makes no sense: what is wrong, and the fields it
//! is about, best candidate first (`locate` points the SRE at whichever the file spells
//! out). Shared by the checks of every section (`validate`, `admit`).

/// What is wrong and where to look, best candidate first.
#[derive(Debug)]
pub struct Problem {
    pub fields: Vec<String>,
    pub message: String,
}

pub(super) fn problem(base: &str, fields: &[&str], message: String) -> Problem {
    let join = |f: &str| {
        if base.is_empty() {
            f.to_string()
        } else {
            format!("{base}.{f}")
        }
    };
    Problem {
        fields: fields.iter().map(|f| join(f)).collect(),
        message,
    }
}

pub(super) fn range<T: PartialOrd + std::fmt::Display>(
    base: &str,
    field: &str,
    v: T,
    lo: T,
    hi: T,
    unit: &str,
) -> Result<(), Problem> {
    if v < lo || v > hi {
        return Err(problem(
            base,
            &[field],
            format!("{v} is out of range: must be {lo}..={hi}{unit}"),
        ));
    }
    Ok(())
}
