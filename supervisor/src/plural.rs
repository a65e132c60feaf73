//! Counts in words: "1 spec", "2 specs" (a leaf).

/// `n` and the noun, singular for one ("1 spec"), else with `s` ("0 specs", "2 specs").
pub fn n(count: usize, noun: &str) -> String {
    if count == 1 {
        format!("1 {noun}")
    } else {
        format!("{count} {noun}s")
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn one_is_singular_and_every_other_count_plural() {
        assert_eq!(super::n(1, "spec"), "1 spec");
        assert_eq!(super::n(0, "spec"), "0 specs");
        assert_eq!(super::n(2, "file"), "2 files");
    }
}
