// Logging to the host's log, which attaches job, task, subtask and operator. Lines are cut to
// 4 KiB and rate-limited by the host (dropped lines are counted), never a failure.

let sink = null;

export function bind(host) {
  sink = host;
}

function write(level, parts) {
  if (sink) sink.log(level, parts.map((p) => (typeof p === "string" ? p : String(p))).join(" "));
}

export const trace = (...parts) => write(0, parts);
export const debug = (...parts) => write(1, parts);
export const info = (...parts) => write(2, parts);
export const warn = (...parts) => write(3, parts);
export const error = (...parts) => write(4, parts);
