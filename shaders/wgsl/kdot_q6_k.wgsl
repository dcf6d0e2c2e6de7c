// Q6_K against a Q8_K block (see dec_q6_k.wgsl for the layout): (sumi, 0) with
// sumi = sum_g sc_g * (sum_l q_l * a_l - 32 * (sum of the 16 a of sub-block g)).
const KBYTES: u32 = 210u;

fn kscales(b: u32) -> vec2<f32> { return vec2<f32>(wf16(b + 208u), 0.0); }

fn kdot(b: u32, ab: u32) -> vec2<i32> {
    var sumi: i32 = 0;
    // Chunk c of 32 values is half n = c / 4, group g = c % 4 (as dec_q6_k.wgsl).
    for (var c = 0u; c < 8u; c++) {
        let n = c >> 2u;
        let g = c & 3u;
        let ql = b + 64u * n + (g & 1u) * 32u;
        let qh = b + 128u + 32u * n;
        let lshift = (g >> 1u) * 4u;
        let hshift = 2u * g;
        var p0: i32 = 0;
        var p1: i32 = 0;
        for (var w = 0u; w < 8u; w++) {
            let lo = wword(ql + 4u * w) >> lshift;
            let hi = wword(qh + 4u * w) >> hshift;
            var part: i32 = 0;
            for (var i = 0u; i < 4u; i++) {
                let q = ((lo >> (8u * i)) & 0xfu) | (((hi >> (8u * i)) & 3u) << 4u);
                part += i32(q) * aq(ab, 32u * c + 4u * w + i);
            }
            if (w < 4u) { p0 += part; } else { p1 += part; }
        }
        let sc = b + 192u + 8u * n + 2u * g;
        let bs0 = bitcast<i32>(qa[ab + 65u + 2u * c]);
        let bs1 = bitcast<i32>(qa[ab + 66u + 2u * c]);
        sumi += i32(wi8(sc)) * (p0 - 32 * bs0) + i32(wi8(sc + 1u)) * (p1 - 32 * bs1);
    }
    return vec2<i32>(sumi, 0);
}
