//! The per-function request forecaster interface and the naive baseline.
//!
//! Owns: the [`Forecaster`] trait (per function, per-minute counts, one-minute-ahead forecasts)
//! and [`LastValue`], the naive "next minute = this minute" forecast that LS-LSTM must beat.
//!
//! Must never: see a count before the simulator or the manager has observed it (forecasts are
//! strictly online).

/// One function's request forecaster: fed the count of every minute in order, asked for the
/// expected count of the next minute.
pub trait Forecaster: Send {
    /// Short name for reports.
    fn name(&self) -> String;
    /// Records the number of requests that arrived in the next minute of the series (minutes are
    /// fed in order, without gaps; feed 0 for idle minutes).
    fn observe(&mut self, count: u32);
    /// Expected number of requests in the minute after the last observed one (≥ 0).
    fn forecast(&mut self) -> anyhow::Result<f64>;
}

/// Naive forecast: the next minute repeats the last observed minute.
#[derive(Debug, Default, Clone)]
pub struct LastValue {
    last: u32,
}

impl Forecaster for LastValue {
    fn name(&self) -> String {
        "last-value".into()
    }
    fn observe(&mut self, count: u32) {
        self.last = count;
    }
    fn forecast(&mut self) -> anyhow::Result<f64> {
        Ok(f64::from(self.last))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn last_value_repeats_last_minute() {
        let mut f = LastValue::default();
        assert_eq!(f.forecast().unwrap(), 0.0);
        f.observe(3);
        f.observe(5);
        assert_eq!(f.forecast().unwrap(), 5.0);
    }
}
