// BullMQ producer for the peer benchmark: node producer.mjs URL enqueue N | latency N WARMUP
// | fill N. Prints one JSON line.
import { Queue, QueueEvents } from "bullmq";
import IORedis from "ioredis";

const [url, what, nArg, warmArg] = process.argv.slice(2);
const n = Number(nArg);
const connection = new IORedis(url, { maxRetriesPerRequest: null });
const queue = new Queue("bench", { connection });
const now = () => Number(process.hrtime.bigint()) / 1e6;
const pct = (xs, p) => { const s = [...xs].sort((a, b) => a - b); return s[Math.max(1, Math.min(s.length, Math.ceil(p * s.length / 100))) - 1]; };
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const out = {};
if (what === "enqueue") {
  await queue.add("job", { n: -1 });
  let t = now();
  for (let i = 0; i < n; i++) await queue.add("job", { n: i });
  out.single_per_s = n / ((now() - t) / 1000);
  await connection.flushdb();
  t = now();
  for (let s = 0; s < n; s += 1000) {
    const batch = [];
    for (let i = s; i < Math.min(n, s + 1000); i++) batch.push({ name: "job", data: { n: i } });
    await queue.addBulk(batch);
  }
  out.bulk_per_s = n / ((now() - t) / 1000);
  out.bulk_api = "Queue.addBulk";
} else if (what === "fill") {
  for (let s = 0; s < n; s += 1000) {
    const batch = [];
    for (let i = s; i < Math.min(n, s + 1000); i++) batch.push({ name: "job", data: { n: i } });
    await queue.addBulk(batch);
  }
} else if (what === "latency") {
  const events = new QueueEvents("bench", { connection: new IORedis(url, { maxRetriesPerRequest: null }) });
  await events.waitUntilReady();
  const rtt = [], start = [];
  const warm = Number(warmArg || 20);
  for (let i = 0; i < n + warm + 1; i++) {
    await sleep(5);
    const t0 = Date.now() / 1000, p0 = now();
    const job = await queue.add("stamp", {});
    const res = await job.waitUntilFinished(events, 30000);
    if (i > warm) { rtt.push(now() - p0); start.push((res - t0) * 1000); }
  }
  Object.assign(out, { rtt_p50_ms: pct(rtt, 50), rtt_p99_ms: pct(rtt, 99), start_p50_ms: pct(start, 50), start_p99_ms: pct(start, 99) });
  await events.close();
}
await queue.close();
await connection.quit();
console.log(JSON.stringify(out));
process.exit(0);
