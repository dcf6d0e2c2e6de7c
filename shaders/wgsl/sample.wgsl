// The `Sample` node on the device: one workgroup of 64 lanes per row, the CPU runtime's
// semantics (`poot_runtime::sample`; rank.wgsl and f64math.wgsl come first).
//
// A row with a NaN or +inf, or with every value -inf, gives -1; temperature 0 (inv_t 0) is the
// first maximum (float comparison, as the CPU's argmax). Otherwise the weights are the CPU's,
// w = exp((f64(x) - f64(max)) * inv_t) in f64, and instead of sorting, every cut is a search
// over the rank order (descending value, ties by lower id: the (rank_key, id) order), 4 bits of
// the key per pass, each pass summing per-bin counts and weights in a fixed tree over the
// lanes: top-k is the k-th key; top-p the first key whose running mass reaches top_p * total;
// min-p the count of weights >= min_p; the draw the first kept key whose running mass exceeds
// u * kept mass (the last kept key when rounding leaves none). The result depends on neither
// thread scheduling nor the device's parallelism.
//
// Draws equal the CPU's unless u * kept mass (or top_p * total) falls between the CPU's and
// this kernel's value of some running mass: the sums here are a tree, the CPU's sequential in
// rank order, and exp64 is a few ulp from glibc's exp, so each running mass of n weights
// differs by at most about (n + 16) * 2^-52 of the kept mass. A draw differs with probability
// at most the sum of those differences over the kept keys: below V^2 * 2^-52 (5e-7 at
// V = 49152) in the worst case, near V^1.5 * 2^-53 (1e-9) when the roundings do not share a
// sign, and far less for the peaked rows of real models.
struct P { v: u32, rows: u32, id_digits: u32, _a: u32 }
@group(0) @binding(0) var<storage, read> x: array<f32>;
// Per row, computed on the host as the CPU does: 1/temperature (0: greedy), top_k, top_p,
// min_p, u (f64).
@group(0) @binding(1) var<storage, read> rp: array<f64>;
@group(0) @binding(2) var<storage, read_write> y: array<i32>;
@group(0) @binding(3) var<uniform> p: P;

// Per-lane partials: 16 bins of 64 lanes.
var<workgroup> sm: array<f64, 1024>;
var<workgroup> sc: array<u32, 1024>;
// A search's state: the key's rank key, its id, found, keys ranked before it; then a flag.
var<workgroup> wu: array<u32, 5>;
var<workgroup> wm: f64;
var<private> ctx: vec2<f64>; // inv_t, the row's maximum
const NONE: u32 = 0xffffffffu;

fn weight(v: f32) -> f64 {
    return exp64((f64(v) - ctx.y) * ctx.x);
}

fn in_set(h: u32, i: u32, bh: u32, bl: u32) -> bool {
    return h < bh || (h == bh && i <= bl);
}

// Sums sm/sc over the lanes for bins below nb, in a fixed tree.
fn reduce(li: u32, nb: u32) {
    workgroupBarrier();
    for (var s = 32u; s > 0u; s >>= 1u) {
        if (li < s) {
            for (var b = 0u; b < nb; b++) {
                sm[b * 64u + li] += sm[b * 64u + li + s];
                sc[b * 64u + li] += sc[b * 64u + li + s];
            }
        }
        workgroupBarrier();
    }
}

// Into sm[0]/sc[0]: the weight of the keys up to (bh, bl), and how many weigh >= floor.
fn mass(li: u32, row: u32, bh: u32, bl: u32, floor: f64) {
    workgroupBarrier();
    sm[li] = 0.0lf;
    sc[li] = 0u;
    for (var i = li; i < p.v; i += 64u) {
        let v = x[row + i];
        if (in_set(rank_key(v), i, bh, bl)) {
            let w = weight(v);
            sm[li] += w;
            sc[li] += select(0u, 1u, w >= floor);
        }
    }
    reduce(li, 1u);
}

// Lane 0: the first bin (in rank order) at which the running total reaches goal.
fn pick(mode: u32, goal: f64, d: u32) {
    var m = wm;
    var c = wu[3];
    var got = 16u;
    var last = vec3<f64>(16.0lf, 0.0lf, 0.0lf);
    for (var b = 0u; b < 16u; b++) {
        let n = sc[b * 64u];
        if (n == 0u) { continue; }
        let t = m + sm[b * 64u];
        last = vec3<f64>(f64(b), m, f64(c));
        if (select(select(t > goal, t >= goal, mode == 1u), f64(c + n) >= goal, mode == 0u)) {
            got = b;
            break;
        }
        m = t;
        c += n;
    }
    // Past the first digit the coarser bin held the crossing; rounding may hide it here.
    if (got == 16u && d > 0u && last.x < 16.0lf) {
        got = u32(last.x);
        m = last.y;
        c = u32(last.z);
    }
    if (got == 16u) {
        wu[2] = 0u;
        return;
    }
    wm = m;
    wu[3] = c;
    if (d < 8u) { wu[0] |= got << (28u - 4u * d); } else { wu[1] |= got << (4u * (7u + p.id_digits - d)); }
}

// Walks the keys up to (bh, bl) in rank order to the first one at which the running total
// reaches goal: mode 0 counts keys (>= goal), 1 sums weights (>= goal), 2 sums weights
// (> goal). Leaves the key in wu[0], wu[1], the keys ranked before it in wu[3], wu[2] = 0
// when none reaches goal.
fn search(li: u32, row: u32, mode: u32, goal: f64, bh: u32, bl: u32) {
    workgroupBarrier();
    if (li == 0u) {
        wu = array<u32, 5>(0u, 0u, 1u, 0u, 0u);
        wm = 0.0lf;
    }
    workgroupBarrier();
    for (var d = 0u; d < 8u + p.id_digits; d++) {
        let pre = vec3<u32>(wu[0], wu[1], wu[2]);
        var cm: array<f64, 16>;
        var cc: array<u32, 16>;
        for (var i = li; i < p.v && pre.z != 0u; i += 64u) {
            let v = x[row + i];
            let h = rank_key(v);
            if (!in_set(h, i, bh, bl)) { continue; }
            var g = (h >> (28u - 4u * min(d, 7u))) & 15u;
            if (d < 8u) {
                if (d > 0u && (h >> (32u - 4u * d)) != (pre.x >> (32u - 4u * d))) { continue; }
            } else {
                let sh = 4u * (7u + p.id_digits - d);
                if (h != pre.x || (d > 8u && (i >> (sh + 4u)) != (pre.y >> (sh + 4u)))) { continue; }
                g = (i >> sh) & 15u;
            }
            cc[g] += 1u;
            if (mode != 0u) { cm[g] += weight(v); }
        }
        for (var b = 0u; b < 16u; b++) {
            sm[b * 64u + li] = cm[b];
            sc[b * 64u + li] = cc[b];
        }
        reduce(li, 16u);
        if (li == 0u && pre.z != 0u) { pick(mode, goal, d); }
        workgroupBarrier();
    }
}

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let r = wid.x;
    let row = r * p.v;
    // Pass 1: broken values, the first maximum, the candidates (values above -inf).
    var bv = 0.0;
    var bi = NONE;
    var bad = 0u;
    var n = 0u;
    for (var i = li; i < p.v; i += 64u) {
        let v = x[row + i];
        if (broken(v)) {
            bad = 1u;
        } else if (bitcast<u32>(v) != NEG_INF_BITS) {
            n += 1u;
            if (bi == NONE || v > bv) {
                bv = v;
                bi = i;
            }
        }
    }
    sm[li] = f64(bv);
    sc[li] = bi;
    sc[64u + li] = bad;
    sc[128u + li] = n;
    workgroupBarrier();
    for (var s = 32u; s > 0u; s >>= 1u) {
        if (li < s) {
            let j = sc[li + s];
            if (j != NONE && (sc[li] == NONE || sm[li + s] > sm[li] || (sm[li + s] == sm[li] && j < sc[li]))) {
                sm[li] = sm[li + s];
                sc[li] = j;
            }
            sc[64u + li] |= sc[64u + li + s];
            sc[128u + li] += sc[128u + li + s];
        }
        workgroupBarrier();
    }
    let prm = array<f64, 5>(rp[r * 5u], rp[r * 5u + 1u], rp[r * 5u + 2u], rp[r * 5u + 3u], rp[r * 5u + 4u]);
    if (li == 0u) {
        wu[4] = 0u;
        if (sc[64u] != 0u || sc[0] == NONE) {
            y[r] = -1;
        } else if (prm[0] == 0.0lf) {
            y[r] = i32(sc[0]);
        } else {
            wu[4] = sc[128u];
            wm = sm[0];
        }
    }
    let nc0 = f64(workgroupUniformLoad(&wu[4]));
    if (nc0 == 0.0lf) { return; }
    ctx = vec2<f64>(prm[0], wm);
    // The candidates: keys up to (bh, bl); top-k makes that its k-th key.
    var bh = KEY_FINITE;
    var bl = NONE;
    var nc = nc0;
    var keyed = prm[1] > 0.0lf && prm[1] < nc0;
    if (keyed) {
        search(li, row, 0u, prm[1], bh, bl);
        bh = wu[0];
        bl = wu[1];
        nc = prm[1];
    }
    mass(li, row, bh, bl, prm[3]);
    if (li == 0u) { wm = sm[0]; wu[4] = sc[0]; }
    let total = workgroupUniformLoad(&wm);
    let lim = f64(workgroupUniformLoad(&wu[4]));
    // The kept set: the shortest prefix reaching top_p of the mass, at most the min-p ones.
    var kept = total;
    var kh = bh;
    var kl = bl;
    if (prm[2] < 1.0lf || lim < nc) {
        var keep = lim;
        if (prm[2] < 1.0lf) {
            search(li, row, 1u, prm[2] * total, bh, bl);
            if (workgroupUniformLoad(&wu[2]) != 0u) { keep = min(keep, f64(wu[3] + 1u)); }
        }
        search(li, row, 0u, keep, bh, bl);
        kh = wu[0];
        kl = wu[1];
        keyed = true;
        mass(li, row, kh, kl, 0.0lf);
        if (li == 0u) { wm = sm[0]; }
        kept = workgroupUniformLoad(&wm);
    }
    search(li, row, 2u, prm[4] * kept, kh, kl);
    let found = workgroupUniformLoad(&wu[2]) != 0u;
    if (!found && !keyed) {
        search(li, row, 0u, nc, bh, bl); // the last candidate
    }
    if (li == 0u) { y[r] = i32(select(kl, wu[1], found || !keyed)); }
}
