// f64 exp and ln from f64 adds, multiplies, divisions and ldexp only (SPIR-V's Exp and Log
// take 16/32-bit floats): Cody-Waite reduction by ln 2, then a degree-13 Taylor polynomial
// (truncation below 4e-18 relative), and 2 atanh((m-1)/(m+1)) for ln on m in [sqrt(1/2),
// sqrt(2)). Within a few ulp of glibc's exp and log, which the CPU runtime calls; not bit
// identical (see sample.wgsl for what that means for draws).
const LN2_HI: f64 = 6.93147180369123816490e-01lf;
const LN2_LO: f64 = 1.90821492927058770002e-10lf;

fn exp64(y: f64) -> f64 {
    if (y < -746.0lf) { return 0.0lf; }
    let k = round(y * 1.4426950408889634lf);
    let r = (y - k * LN2_HI) - k * LN2_LO;
    var s = 1.6059043836821613e-10lf * r + 2.08767569878681e-09lf;
    s = (s * r + 2.505210838544172e-08lf) * r + 2.755731922398589e-07lf;
    s = (s * r + 2.7557319223985893e-06lf) * r + 2.48015873015873e-05lf;
    s = (s * r + 0.0001984126984126984lf) * r + 0.001388888888888889lf;
    s = (s * r + 0.008333333333333333lf) * r + 0.041666666666666664lf;
    s = ((s * r + 0.16666666666666666lf) * r + 0.5lf) * r + 1.0lf;
    return ldexp(s * r + 1.0lf, i32(k));
}

// ln(s) for s >= 1 (a softmax denominator).
fn ln64(s: f64) -> f64 {
    var e = i32(floor(log2(f32(s))));
    var m = ldexp(s, -e);
    if (m >= 2.0lf) { m = m * 0.5lf; e += 1; }
    if (m < 1.0lf) { m = m * 2.0lf; e -= 1; }
    if (m > 1.4142135623730951lf) { m = m * 0.5lf; e += 1; }
    let z = (m - 1.0lf) / (m + 1.0lf);
    let z2 = z * z;
    var t = 0.043478260869565216lf * z2 + 0.047619047619047616lf;
    t = (t * z2 + 0.05263157894736842lf) * z2 + 0.058823529411764705lf;
    t = (t * z2 + 0.06666666666666667lf) * z2 + 0.07692307692307693lf;
    t = (t * z2 + 0.09090909090909091lf) * z2 + 0.1111111111111111lf;
    t = (t * z2 + 0.14285714285714285lf) * z2 + 0.2lf;
    t = ((t * z2 + 0.3333333333333333lf) * z2 + 1.0lf) * z;
    return f64(e) * LN2_HI + (f64(e) * LN2_LO + 2.0lf * t);
}
