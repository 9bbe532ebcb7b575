// Calls of the REST API with the login cookie (sent by the browser, never readable here) and
// the CSRF value the server gave at login, which every request that changes something carries.

let csrf = null;

export class ApiError extends Error {
  constructor(status, code, message) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

export function setCsrf(value) {
  csrf = value;
}

// fetch + the error envelope {"error": {code, message}} turned into an ApiError.
export async function api(path, { method = "GET", body, agent, query } = {}) {
  const url = new URL(path, location.origin);
  for (const [key, value] of Object.entries(query || {})) {
    if (value !== undefined && value !== null && value !== "") url.searchParams.set(key, value);
  }
  const headers = { Accept: "application/json" };
  if (agent) headers["X-Shellyard-Agent"] = agent;
  if (method !== "GET") headers["X-Shellyard-CSRF"] = csrf || "login";
  if (body !== undefined) headers["Content-Type"] = "application/json";
  let response;
  try {
    response = await fetch(url, {
      method,
      headers,
      credentials: "same-origin",
      body: body === undefined ? undefined : JSON.stringify(body),
    });
  } catch (err) {
    throw new ApiError(0, "unreachable", `the server cannot be reached (${err.message})`);
  }
  const text = await response.text();
  let data = null;
  try {
    data = text ? JSON.parse(text) : null;
  } catch {
    data = null;
  }
  if (!response.ok) {
    const error = (data && data.error) || {};
    throw new ApiError(
      response.status,
      error.code || String(response.status),
      error.message || `${method} ${url.pathname} answered ${response.status}`,
    );
  }
  return data;
}

// A URL of this server with query parameters (for download links).
export function href(path, query) {
  const url = new URL(path, location.origin);
  for (const [key, value] of Object.entries(query || {})) {
    if (value !== undefined && value !== null && value !== "") url.searchParams.set(key, value);
  }
  return url.pathname + url.search;
}
