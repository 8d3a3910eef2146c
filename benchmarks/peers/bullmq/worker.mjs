// BullMQ worker for the peer benchmark: node worker.mjs (env BENCH_URL, BENCH_CONC,
// BENCH_SLEEP_MS, BENCH_VT, BENCH_COUNT_START). Counts completions like common.py does:
// INCRBY bench:done every 50 ms, with the first start / last completion times.
import { Worker } from "bullmq";
import IORedis from "ioredis";

const url = process.env.BENCH_URL;
const sleepMs = Number(process.env.BENCH_SLEEP_MS || 0);
const vt = process.env.BENCH_VT ? Number(process.env.BENCH_VT) * 1000 : null;
const countStart = !!process.env.BENCH_COUNT_START;
const r = new IORedis(url, { maxRetriesPerRequest: null });
let count = 0, flushed = 0, first = null, last = 0;
setInterval(async () => {
  const d = count - flushed;
  if (d <= 0) return;
  flushed = count;
  await r.multi().incrby("bench:done", d)
    .zadd("bench:first", "NX", first / 1000, String(process.pid))
    .zadd("bench:last", "GT", last / 1000, String(process.pid)).exec();
}, 50);

const opts = {
  connection: new IORedis(url, { maxRetriesPerRequest: null }),
  concurrency: Number(process.env.BENCH_CONC || 100),
};
if (vt) { opts.lockDuration = vt; opts.stalledInterval = vt; }
// BENCH_BULL_REMOVE: the auto-removal BullMQ's docs recommend for production
// (docs.bullmq.io/guide/workers/auto-removal-of-jobs): keep the last 1,000 completed and
// 5,000 failed jobs instead of every one (its default)
if (process.env.BENCH_BULL_REMOVE) {
  opts.removeOnComplete = { count: 1000 };
  opts.removeOnFail = { count: 5000 };
}
// the flow workload (flows.mjs, benchmarks/peers/flowload.py): a parent reads its children's
// results (Job.getChildrenValues); the fan-in's parent and the chain's last step note the
// time and what they saw (bench:flow_end, bench:flow_n)
const flowEnd = (seen) => r.multi().set("bench:flow_end", String(Date.now() / 1000))
  .set("bench:flow_n", seen).exec();
async function flowJob(job) {
  if (job.name === "fsink") {
    const seen = Object.keys(await job.getChildrenValues()).length;
    await flowEnd(seen);
    return { skip: true, value: seen };
  }
  if (job.name === "cstep") {
    const prev = Object.values(await job.getChildrenValues());
    const v = (prev.length ? Number(prev[0]) : 0) + 1;
    if (job.data.last) await flowEnd(v);
    return { skip: false, value: v };
  }
  return { skip: false, value: 1 }; // fnoop
}
const worker = new Worker("bench", async (job) => {
  if (job.name === "stamp") return Date.now() / 1000;
  let ret = null;
  if (job.name !== "job") {
    const f = await flowJob(job);
    if (f.skip) return f.value;
    ret = f.value;
  }
  if (first === null) first = Date.now();
  if (countStart) await r.incr("bench:started");
  if (sleepMs) await new Promise((res) => setTimeout(res, sleepMs));
  count += 1;
  last = Date.now();
  return ret;
}, opts);
worker.on("error", (e) => console.error(e));
for (const sig of ["SIGTERM", "SIGINT"]) process.on(sig, async () => { await worker.close(); process.exit(0); });
