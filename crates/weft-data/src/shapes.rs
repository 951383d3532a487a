//! The ten shape classes of `SyntheticShapes`: each is a membership test in
//! coordinates normalised to the shape's bounding box.

/// Human-readable class names, indexed by label.
pub const SHAPE_NAMES: [&str; 10] = [
    "square",
    "disc",
    "triangle",
    "plus",
    "horizontal_bars",
    "vertical_bars",
    "diagonal_stripe",
    "ring",
    "checkerboard",
    "two_dots",
];

/// Where a shape is drawn: a square bounding box in pixel units, optionally
/// mirrored left-right (which changes the diagonal stripe and the two dots).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Placement {
    pub left: f32,
    pub top: f32,
    pub size: f32,
    pub mirrored: bool,
}

/// Whether the pixel at column `x`, row `y` (sampled at its centre) belongs
/// to shape `class` placed at `placement`.
pub(crate) fn covers(class: usize, placement: &Placement, x: usize, y: usize) -> bool {
    let mut u = (x as f32 + 0.5 - placement.left) / placement.size;
    let v = (y as f32 + 0.5 - placement.top) / placement.size;
    if !(0.0..1.0).contains(&u) || !(0.0..1.0).contains(&v) {
        return false;
    }
    if placement.mirrored {
        u = 1.0 - u;
    }
    let within_disc =
        |cx: f32, cy: f32, radius: f32| (u - cx).powi(2) + (v - cy).powi(2) <= radius * radius;
    let band = |t: f32, bands: f32| ((t * bands) as usize).is_multiple_of(2);
    match class {
        0 => true,
        1 => within_disc(0.5, 0.5, 0.5),
        2 => (u - 0.5).abs() <= v / 2.0,
        3 => (u - 0.5).abs() <= 0.15 || (v - 0.5).abs() <= 0.15,
        4 => band(v, 5.0),
        5 => band(u, 5.0),
        6 => (u - v).abs() <= 0.2,
        7 => within_disc(0.5, 0.5, 0.5) && !within_disc(0.5, 0.5, 0.3),
        8 => ((u * 4.0) as usize + (v * 4.0) as usize).is_multiple_of(2),
        9 => within_disc(0.25, 0.25, 0.2) || within_disc(0.75, 0.75, 0.2),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mask(class: usize, mirrored: bool) -> Vec<bool> {
        let placement = Placement {
            left: 0.0,
            top: 0.0,
            size: 20.0,
            mirrored,
        };
        (0..400)
            .map(|i| covers(class, &placement, i % 20, i / 20))
            .collect()
    }

    #[test]
    fn every_class_has_a_distinct_nonempty_partial_mask() {
        let masks: Vec<Vec<bool>> = (0..SHAPE_NAMES.len()).map(|c| mask(c, false)).collect();
        for (class, m) in masks.iter().enumerate() {
            let on = m.iter().filter(|&&b| b).count();
            assert!(on > 20, "{} covers only {on} pixels", SHAPE_NAMES[class]);
            if class != 0 {
                assert!(on < 380, "{} covers {on} pixels", SHAPE_NAMES[class]);
            }
            for other in 0..class {
                assert_ne!(
                    masks[other], *m,
                    "{} == {}",
                    SHAPE_NAMES[other], SHAPE_NAMES[class]
                );
            }
        }
    }

    #[test]
    fn pixels_outside_the_box_are_never_covered() {
        let placement = Placement {
            left: 5.0,
            top: 5.0,
            size: 10.0,
            mirrored: false,
        };
        assert!(covers(0, &placement, 5, 5));
        assert!(covers(0, &placement, 14, 14));
        assert!(!covers(0, &placement, 4, 5));
        assert!(!covers(0, &placement, 15, 14));
    }

    #[test]
    fn mirroring_flips_the_diagonal_stripe() {
        assert!(mask(6, false)[0]);
        assert!(!mask(6, true)[0]);
        assert!(mask(6, true)[19]);
    }
}
