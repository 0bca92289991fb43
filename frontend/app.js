// The call page, two ways to reach the agent:
// - Direct: one RTCPeerConnection to this server (aiortc), a mic track, and an
//   "events" data channel carrying server events to the page and settings back.
// - LiveKit: join a LiveKit room with livekit-client (loaded on demand from
//   /vendor/livekit-client.umd.js), publish the mic, play the agent's track;
//   transcripts arrive on "lk.transcription" text streams, typed errors on
//   "duplex.events", and the agent's state is its "lk.agent.state" participant attribute.
// A worker with an API key wants a short-lived session token: the page takes it from
// its URL fragment (#token=..., never sent to a server or written to its logs) and
// sends it as "Authorization: Bearer"; the key itself never reaches the page.
"use strict";

const $ = (id) => document.getElementById(id);
const ui = {
  connect: $("connect"), status: $("status"), error: $("error"), state: $("agent-state"),
  level: $("level"), turn: $("fig-turn"), barge: $("fig-barge"), rtt: $("fig-rtt"),
  overlap: $("overlap-policy"), instructions: $("instructions"), transcript: $("transcript"),
  audio: $("agent-audio"), enableAudio: $("enable-audio"),
  modeDirect: $("mode-direct"), modeLiveKit: $("mode-livekit"), lkFields: $("livekit-fields"),
  lkUrl: $("lk-url"), lkToken: $("lk-token"), lkTokenInfo: $("lk-token-info"), lkDev: $("lk-dev"),
  lkRoom: $("lk-room"), lkGetToken: $("lk-get-token"), notice: $("notice"), modelNotice: $("model-notice"),
  echoCancel: $("echo-cancel"), whyTurn: $("why-turn"), whyBarge: $("why-barge"), whyRtt: $("why-rtt"),
};

// The call in progress: {kind: "direct", pc, channel, ...} or {kind: "livekit", room, ...};
// both carry stream (the mic), audioContext (the level meter) and timers.
let call = null;
let mode = "direct";

function showError(text) {
  ui.error.textContent = text;
  ui.error.hidden = !text;
}

function setStatus(text) { ui.status.textContent = text; }

// ---- access: secure context and session token ----

const MIC_NEEDS_HTTPS = "The microphone is unavailable: this page was opened over plain HTTP at "
  + location.host + ", and browsers give the microphone only to HTTPS pages (or localhost). "
  + "Start the worker with --tls-self-signed (or --tls-cert/--tls-key) and open https://"
  + location.host + "/ instead.";

/** The session token from the URL fragment (#token=...), taken out of the address bar. */
function takeAccessToken() {
  const params = new URLSearchParams(location.hash.slice(1));
  const token = params.get("token");
  if (!token) return null;
  params.delete("token");
  const rest = params.toString();
  history.replaceState(null, "", location.pathname + location.search + (rest ? "#" + rest : ""));
  return token;
}

let accessToken = takeAccessToken();
window.addEventListener("hashchange", () => {  // a token link opened in the same tab
  const token = takeAccessToken();
  if (token) { accessToken = token; checkAccess(); }
});

function authHeaders(headers) {
  return accessToken ? {...headers, Authorization: "Bearer " + accessToken} : headers;
}

function showNotice(text) {
  ui.notice.textContent = text;
  ui.notice.hidden = !text;
}

async function checkAccess() {
  if (!window.isSecureContext) {
    showNotice(MIC_NEEDS_HTTPS);
    return;
  }
  let access = null;
  try {
    const response = await fetch("/api/access", {cache: "no-store"});
    if (response.ok) access = await response.json();
  } catch { /* an older server: no access control */ }
  showNotice("");
  if (access && access.key_required && !accessToken) {
    showNotice("This worker needs a session token. Open the link its operator gave you "
      + "(`duplex-agent token` prints one: it ends in #token=…).");
  }
}

/** The reason in a refused response, for a person. */
async function refusal(response) {
  let answer = {};
  try { answer = await response.json(); } catch { /* not JSON */ }
  const reason = answer.error ? answer.error.message : response.statusText || `HTTP ${response.status}`;
  if (response.status === 401) {
    return (accessToken ? "the worker refused the session token: " : "this worker needs a session token: ") + reason;
  }
  return reason;
}

function setAgentState(state) {
  ui.state.textContent = state;
  ui.state.className = "state " + state;
}

function formatMs(value) { return value == null ? "–" : Math.round(value) + " ms"; }

/** A figure, or "–" with the reason it is empty shown under it. */
function showFigure(element, why, value) {
  element.textContent = formatMs(value);
  why.hidden = value != null;
}

function showTurnFigures(turnMs, bargeInMs) {
  showFigure(ui.turn, ui.whyTurn, turnMs);
  showFigure(ui.barge, ui.whyBarge, bargeInMs);
}

function showRtt(value) { showFigure(ui.rtt, ui.whyRtt, value); }

/** The model's capabilities (session.created): say so when its weights are random. */
function showModel(capabilities) {
  ui.modelNotice.hidden = !(capabilities && capabilities.random_weights);
}

// ---- transcript ----

const agentLines = new Map(); // response_id -> the line's text <span>
const SPEAKERS = {user: "You", agent: "Agent"};

/** A transcript line labelled with its speaker; returns the <span> that holds its text. */
function addLine(who, text) {
  const li = document.createElement("li");
  li.className = who;
  const speaker = document.createElement("span");
  speaker.className = "speaker";
  speaker.textContent = SPEAKERS[who];
  const words = document.createElement("span");
  words.className = "text";
  words.textContent = text;
  li.append(speaker, words);
  ui.transcript.appendChild(li);
  li.scrollIntoView({block: "nearest"});
  return words;
}

function agentLine(responseId) {
  let words = agentLines.get(responseId);
  if (!words) {
    words = addLine("agent", "");
    agentLines.set(responseId, words);
  }
  return words;
}

// ---- server events ----

function onServerMessage(message) {
  let event;
  try { event = JSON.parse(message.data); } catch { return; }
  switch (event.type) {
    case "agent.state": setAgentState(event.state); break;
    case "input_audio_buffer.speech_started": setStatus("Hearing you"); break;
    case "input_audio_buffer.speech_stopped": setStatus("Connected"); break;
    case "conversation.item.input_audio_transcription.completed":
      if (event.transcript) addLine("user", event.transcript);
      break;
    case "response.output_audio_transcript.delta":
      agentLine(event.response_id).textContent += event.delta;
      break;
    case "response.output_audio_transcript.done":
      agentLine(event.response_id).textContent = event.transcript;
      break;
    case "response.done":
      if (event.status === "cancelled" && agentLines.has(event.response_id)) {
        agentLines.get(event.response_id).parentElement.classList.add("interrupted");
      }
      break;
    case "session.created": case "session.updated":
      showModel(event.session && event.session.capabilities);
      break;
    case "metrics":
      showTurnFigures(event.latency.turn_ms.last, event.latency.barge_in_ms.last);
      showDefinitions(event.definitions || {});
      break;
    case "session.closed": case "error": showAgentEnding(event); break;
  }
}

// A typed error or the end of the session, as either mode's worker sends it (the data channel,
// or the LiveKit room's "duplex.events" text stream).
function showAgentEnding(event) {
  if (event.type === "error") showError(`Agent error (${event.error.code}): ${event.error.message}`);
  else setStatus(event.reason ? `The agent ended the call (${event.reason})` : "The agent ended the call");
}

// What each figure measures comes from the worker (one definition for the page, /metrics
// and logs) and shows as the figure's tooltip.
function showDefinitions(definitions) {
  for (const box of document.querySelectorAll("[data-figure]")) {
    const text = definitions[box.dataset.figure];
    if (text) box.title = text;
  }
}

function sendSettings() {
  if (!call || !call.channel || call.channel.readyState !== "open") return;
  const session = {overlap_policy: ui.overlap.value};
  if (ui.instructions.value.trim()) session.instructions = ui.instructions.value.trim();
  call.channel.send(JSON.stringify({type: "session.update", session}));
}

// ---- microphone ----

// The browser's echo canceller mutes the caller while the agent's voice plays, so it swallows the
// first words of an interruption, and on headphones there is no echo to cancel. It is off unless the
// caller says the agent's voice reaches the microphone: the switch (remembered), or ?echo_cancel=1
// (or 0) in the page's address, which a deployment's link can set.
const ECHO_KEY = "duplex-agent.echo-cancel";
const ECHO_CANCEL_DEFAULT = false;

function initialEchoCancel() {
  const asked = new URLSearchParams(location.search).get("echo_cancel");
  if (asked === "1" || asked === "0") return asked === "1";
  const remembered = localStorage.getItem(ECHO_KEY);
  return remembered === null ? ECHO_CANCEL_DEFAULT : remembered === "1";
}

ui.echoCancel.checked = initialEchoCancel();
ui.echoCancel.addEventListener("change", () => localStorage.setItem(ECHO_KEY, ui.echoCancel.checked ? "1" : "0"));

async function openMicrophone() {
  if (!window.isSecureContext || !navigator.mediaDevices || !navigator.mediaDevices.getUserMedia) {
    throw new Error(ui.notice.hidden ? MIC_NEEDS_HTTPS
      : "The microphone is unavailable over plain HTTP: see the note above.");
  }
  try {
    return await navigator.mediaDevices.getUserMedia({
      audio: {echoCancellation: ui.echoCancel.checked, noiseSuppression: true, autoGainControl: true},
    });
  } catch (err) {
    if (err.name === "NotAllowedError" || err.name === "SecurityError") {
      throw new Error("Microphone access was refused. Allow the microphone for this site in your browser settings, then press Connect again.");
    }
    if (err.name === "NotFoundError") throw new Error("No microphone was found on this device.");
    throw new Error("The microphone could not be opened: " + err.message);
  }
}

function startLevelMeter(stream) {
  const audioContext = new AudioContext();
  const analyser = audioContext.createAnalyser();
  analyser.fftSize = 1024;
  audioContext.createMediaStreamSource(stream).connect(analyser);
  const samples = new Float32Array(analyser.fftSize);
  const draw = () => {
    if (!call || call.audioContext !== audioContext) return;
    analyser.getFloatTimeDomainData(samples);
    let sum = 0;
    for (const s of samples) sum += s * s;
    const db = 20 * Math.log10(Math.sqrt(sum / samples.length) + 1e-9);
    ui.level.style.width = Math.max(0, Math.min(100, (db + 60) * (100 / 60))) + "%";
    requestAnimationFrame(draw);
  };
  requestAnimationFrame(draw);
  return audioContext;
}

// ---- connection ----

function iceGatheringComplete(pc, timeoutMs) {
  if (pc.iceGatheringState === "complete") return Promise.resolve();
  return new Promise((resolve) => {
    const done = () => { pc.removeEventListener("icegatheringstatechange", check); resolve(); };
    const check = () => { if (pc.iceGatheringState === "complete") done(); };
    pc.addEventListener("icegatheringstatechange", check);
    setTimeout(done, timeoutMs);
  });
}

async function readRtt(pc) {
  return rttOf(await pc.getStats());
}

function rttOf(stats) {
  let rtt = null;
  if (!stats) return rtt;
  stats.forEach((report) => {
    if (report.type === "candidate-pair" && report.nominated && report.currentRoundTripTime != null) {
      rtt = report.currentRoundTripTime * 1000;
    }
  });
  return rtt;
}

async function connect() {
  showError("");
  ui.connect.disabled = true;
  setModeTabsEnabled(false);
  setStatus("Asking for the microphone…");
  let stream;
  try {
    stream = await openMicrophone();
  } catch (err) {
    showError(err.message);
    setStatus("Not connected");
    ui.connect.disabled = false;
    setModeTabsEnabled(true);
    return;
  }
  call = {kind: "direct", stream, timers: []};
  call.audioContext = startLevelMeter(stream);
  call.timers.push(setInterval(async () => {
    if (call && call.pc) showRtt(await readRtt(call.pc));
  }, 1000));
  setStatus("Connecting…");
  try {
    await openPeer(call, null);
    ui.connect.textContent = "Disconnect";
    ui.connect.disabled = false;
  } catch (err) {
    disconnect("Not connected");
    showError("Could not connect: " + err.message);
  }
}

/** One peer connection for the call; ``resume`` ({pc_id, resume_token}) reattaches the same conversation. */
async function openPeer(session, resume) {
  const pc = new RTCPeerConnection({iceServers: []});
  const channel = pc.createDataChannel("events");
  Object.assign(session, {pc, channel});
  session.stream.getAudioTracks().forEach((track) => pc.addTrack(track, session.stream));
  pc.ontrack = (event) => { ui.audio.srcObject = event.streams[0] || new MediaStream([event.track]); };
  channel.onmessage = onServerMessage;
  channel.onopen = () => { setStatus("Connected"); setAgentState("listening"); sendSettings(); };
  channel.onclose = () => { if (call === session && session.pc === pc) reconnect(session); };
  pc.onconnectionstatechange = () => {
    if (pc.connectionState === "failed" && call === session && session.pc === pc) reconnect(session);
  };
  await pc.setLocalDescription(await pc.createOffer());
  await iceGatheringComplete(pc, 2000);
  const offer = {sdp: pc.localDescription.sdp, type: pc.localDescription.type, resumable: true};
  if (resume) offer.resume = resume;
  const response = await fetch("/api/offer", {
    method: "POST", headers: authHeaders({"Content-Type": "application/json"}), body: JSON.stringify(offer),
  });
  if (!response.ok) throw new Error(await refusal(response));
  const answer = await response.json();
  Object.assign(session, {pcId: answer.pc_id, resumeToken: answer.resume_token});
  await pc.setRemoteDescription({sdp: answer.sdp, type: answer.type});
}

/** The connection blipped: a new peer connection resumes the same conversation (a few tries). */
async function reconnect(session) {
  if (session.reconnecting) return;
  session.reconnecting = true;
  session.pc.close();
  setStatus("Reconnecting…");
  for (let attempt = 0; attempt < 4 && call === session; attempt++) {
    try {
      await openPeer(session, {pc_id: session.pcId, resume_token: session.resumeToken});
      session.reconnecting = false;
      return;
    } catch (err) {
      if (/expired|token/i.test(err.message)) break;  // nothing left to resume
      await new Promise((resolve) => setTimeout(resolve, 500 * 2 ** attempt));
    }
  }
  session.reconnecting = false;
  if (call === session) disconnect("The connection failed");
}

function disconnect(statusText) {
  if (!call) return;
  const session = call;
  call = null;
  session.timers.forEach(clearInterval);
  if (session.kind === "direct" && session.pcId) {
    // Hang up on purpose, so the server does not keep the conversation for a resume.
    fetch("/api/offer", {method: "DELETE", keepalive: true, headers: authHeaders({"Content-Type": "application/json"}),
      body: JSON.stringify({pc_id: session.pcId})}).catch(() => {});
  }
  if (session.kind === "direct" && session.pc) session.pc.close();
  else session.room.disconnect().catch(() => {});
  session.stream.getTracks().forEach((track) => track.stop());
  session.audioContext.close();
  ui.level.style.width = "0%";
  ui.audio.srcObject = null;
  ui.enableAudio.hidden = true;
  showRtt(null);
  ui.modelNotice.hidden = true;
  setAgentState("idle");
  setStatus(statusText);
  ui.connect.textContent = "Connect";
  ui.connect.disabled = false;
  setModeTabsEnabled(true);
}

ui.connect.addEventListener("click", () => {
  if (call) disconnect("Not connected");
  else if (mode === "livekit") connectLiveKit();
  else connect();
});
ui.overlap.addEventListener("change", sendSettings);
ui.instructions.addEventListener("change", sendSettings);

// ---- modes ----

/** The controls that only make sense between calls: the mode tabs and the LiveKit fields. */
function setModeTabsEnabled(enabled) {
  for (const control of [ui.modeDirect, ui.modeLiveKit, ui.lkUrl, ui.lkToken, ui.lkRoom, ui.lkGetToken, ui.echoCancel]) {
    control.disabled = !enabled;
  }
}

function selectMode(next) {
  if (call || next === mode) return;
  mode = next;
  document.body.dataset.mode = mode;
  ui.modeDirect.classList.toggle("active", mode === "direct");
  ui.modeLiveKit.classList.toggle("active", mode === "livekit");
  ui.modeDirect.setAttribute("aria-selected", String(mode === "direct"));
  ui.modeLiveKit.setAttribute("aria-selected", String(mode === "livekit"));
  ui.lkFields.hidden = mode !== "livekit";
  showError("");
  if (mode === "livekit") loadLiveKit().catch((err) => showError(err.message));
}

ui.modeDirect.addEventListener("click", () => selectMode("direct"));
ui.modeLiveKit.addEventListener("click", () => selectMode("livekit"));

// ---- LiveKit: the client library, on demand ----

const LIVEKIT_CLIENT_URL = "/vendor/livekit-client.umd.js";
let livekitLoading = null;

function loadLiveKit() {
  if (window.LivekitClient) return Promise.resolve(window.LivekitClient);
  if (!livekitLoading) {
    livekitLoading = new Promise((resolve, reject) => {
      const script = document.createElement("script");
      script.src = LIVEKIT_CLIENT_URL;
      script.onload = () => (window.LivekitClient ? resolve(window.LivekitClient)
        : reject(new Error("The LiveKit client library loaded but did not start.")));
      script.onerror = () => {
        livekitLoading = null;
        script.remove();
        reject(new Error("The LiveKit client library is not installed on this server "
          + "(run `npm ci --prefix frontend`, or `make install`)."));
      };
      document.head.appendChild(script);
    });
  }
  return livekitLoading;
}

// ---- LiveKit: URL, token and dev tokens ----

const URL_KEY = "duplex-agent.livekit-url";

function randomName(prefix) {
  const bytes = crypto.getRandomValues(new Uint8Array(4));
  return prefix + Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("");
}

/** The claims of a JWT, or null when it is not one. Nothing is verified here: the server does that. */
function tokenClaims(token) {
  const parts = token.split(".");
  if (parts.length !== 3) return null;
  try {
    const base64 = parts[1].replace(/-/g, "+").replace(/_/g, "/");
    const json = decodeURIComponent(Array.from(atob(base64.padEnd(Math.ceil(base64.length / 4) * 4, "=")),
      (c) => "%" + c.charCodeAt(0).toString(16).padStart(2, "0")).join(""));
    const claims = JSON.parse(json);
    return claims && typeof claims === "object" ? claims : null;
  } catch {
    return null;
  }
}

/** Why these inputs cannot work, or "" when they might. */
function liveKitInputProblem(url, token) {
  if (!url) return "Enter the LiveKit server's URL (ws://… or wss://…).";
  let parsed;
  try { parsed = new URL(url); } catch { parsed = null; }
  if (!parsed || !["ws:", "wss:", "http:", "https:"].includes(parsed.protocol)) {
    return `"${url}" is not a LiveKit URL: it should look like wss://your-project.livekit.cloud or ws://host:7880.`;
  }
  if (!token) return "Enter a token for the room (or get a dev token).";
  const claims = tokenClaims(token);
  if (!claims) return "That token is not a LiveKit token (a JWT: three parts separated by dots).";
  if (typeof claims.exp === "number" && claims.exp * 1000 < Date.now()) {
    return `That token expired at ${new Date(claims.exp * 1000).toLocaleString()}; get a new one.`;
  }
  if (!claims.video || !claims.video.roomJoin) return "That token does not allow joining a room (no roomJoin grant).";
  return "";
}

function describeToken() {
  const token = ui.lkToken.value.trim();
  const claims = token ? tokenClaims(token) : null;
  ui.lkTokenInfo.classList.remove("bad");
  if (!token) { ui.lkTokenInfo.textContent = ""; return; }
  if (!claims) {
    ui.lkTokenInfo.textContent = "Not a JWT.";
    ui.lkTokenInfo.classList.add("bad");
    return;
  }
  const room = claims.video && claims.video.room ? claims.video.room : "?";
  let text = `Room ${room} as ${claims.sub || "?"}`;
  if (typeof claims.exp === "number") {
    const expired = claims.exp * 1000 < Date.now();
    text += expired ? ", expired" : `, valid until ${new Date(claims.exp * 1000).toLocaleTimeString()}`;
    if (expired) ui.lkTokenInfo.classList.add("bad");
  }
  ui.lkTokenInfo.textContent = text;
}

async function loadLiveKitConfig() {
  ui.lkUrl.value = localStorage.getItem(URL_KEY) || "";
  ui.lkRoom.value = randomName("duplex-");
  let config = null;
  try {
    const response = await fetch("/api/livekit/config", {cache: "no-store"});
    if (response.ok) config = await response.json();
  } catch { /* an older server: no dev tokens */ }
  if (!config || !config.enabled) return;
  ui.lkDev.hidden = false;
  if (!ui.lkUrl.value && config.url) ui.lkUrl.value = config.url;
}

async function getDevToken() {
  showError("");
  ui.lkGetToken.disabled = true;
  try {
    const room = ui.lkRoom.value.trim() || randomName("duplex-");
    const response = await fetch("/api/livekit/token", {
      method: "POST",
      headers: authHeaders({"Content-Type": "application/json"}),
      body: JSON.stringify({room, identity: randomName("caller-")}),
    });
    if (!response.ok) throw new Error(await refusal(response));
    const answer = await response.json();
    ui.lkUrl.value = answer.url;
    ui.lkToken.value = answer.token;
    ui.lkRoom.value = answer.room;
    localStorage.setItem(URL_KEY, answer.url);
    describeToken();
    setStatus(`Dev token ready for room ${answer.room}`);
  } catch (err) {
    showError("Could not get a dev token: " + err.message);
  } finally {
    ui.lkGetToken.disabled = false;
  }
}

ui.lkGetToken.addEventListener("click", getDevToken);
ui.lkToken.addEventListener("input", describeToken);

// ---- LiveKit: the call ----

const TRANSCRIPTION_TOPIC = "lk.transcription";
const EVENTS_TOPIC = "duplex.events";  // the worker's typed error and session.closed events, as wire JSON
const AGENT_STATE = "lk.agent.state";
// Set by the worker beside its state: what the Direct mode's data channel carries.
const RANDOM_WEIGHTS = "duplex.random_weights", TURN_MS = "duplex.turn_ms", BARGE_IN_MS = "duplex.barge_in_ms";

function describeLiveKitError(LK, err, url) {
  if (err && err.name === "ConnectionError") {
    const R = LK.ConnectionErrorReason;
    switch (err.reason) {
      case R.NotAllowed:
        return `The LiveKit server refused the token${err.status ? ` (HTTP ${err.status})` : ""}: `
          + `${err.message}. Get a token for this server and room.`;
      case R.ServerUnreachable:
        return `Could not reach the LiveKit server at ${url}. Check the URL and that the server is running.`;
      case R.Timeout:
        return `The LiveKit server at ${url} did not answer in time (${err.message}).`;
      case R.Cancelled:
        return "The connection attempt was cancelled.";
      case R.LeaveRequest:
        return "The LiveKit server turned the connection away: " + err.message;
      default:
        return `Could not connect to LiveKit (${err.reasonName || "error"}): ${err.message}`;
    }
  }
  return "Could not connect to LiveKit: " + (err && err.message ? err.message : String(err));
}

function describeDisconnect(LK, reason) {
  const R = LK.DisconnectReason;
  switch (reason) {
    case R.DUPLICATE_IDENTITY: return "Disconnected: someone joined with the same identity";
    case R.PARTICIPANT_REMOVED: return "Disconnected: you were removed from the room";
    case R.ROOM_DELETED: case R.ROOM_CLOSED: return "Disconnected: the room was closed";
    case R.SERVER_SHUTDOWN: return "Disconnected: the LiveKit server shut down";
    case R.JOIN_FAILURE: return "Disconnected: joining the room failed";
    default: return "Disconnected";
  }
}

/** The room's agent: a remote participant of kind AGENT or one that publishes lk.agent.state. */
function agentOf(LK, room) {
  for (const participant of room.remoteParticipants.values()) {
    if (participant.kind === LK.ParticipantKind.AGENT || AGENT_STATE in (participant.attributes || {})) {
      return participant;
    }
  }
  return null;
}

function showLiveKitAgent(session) {
  if (call !== session || !session.joined) return;
  const agent = agentOf(session.LK, session.room);
  if (!agent) {
    setAgentState("idle");
    setStatus("Connected; waiting for the agent to join");
    return;
  }
  const attributes = agent.attributes || {};
  setAgentState(attributes[AGENT_STATE] || "idle");
  showModel({random_weights: attributes[RANDOM_WEIGHTS] === "true"});
  const figure = (name) => (attributes[name] ? Number(attributes[name]) : null);
  showTurnFigures(figure(TURN_MS), figure(BARGE_IN_MS));
  setStatus("Connected");
}

/** Whether a transcription stream is about what the local person said. */
function spokenLocally(room, senderIdentity, attributes) {
  const local = room.localParticipant;
  if (senderIdentity && senderIdentity === local.identity) return true;
  const trackId = attributes["lk.transcribed_track_id"];
  return Boolean(trackId && local.trackPublications.has(trackId));
}

async function onTranscription(session, reader, senderIdentity) {
  const attributes = (reader.info && reader.info.attributes) || {};
  const who = spokenLocally(session.room, senderIdentity, attributes) ? "user" : "agent";
  const segment = attributes["lk.segment_id"] || reader.info.id;
  const final = attributes["lk.transcription_final"] === "true";
  const key = who + ":" + segment;
  let words = session.segments.get(key);
  if (!words) {
    words = addLine(who, "");
    session.segments.set(key, words);
  }
  const li = words.parentElement;
  if (final) {
    const text = await reader.readAll();
    if (call !== session) return;
    li.dataset.final = "true";
    li.classList.remove("interim");
    words.textContent = text;
    if (!text.trim()) li.remove();
    return;
  }
  li.classList.add("interim");
  for await (const chunk of reader) {
    if (call !== session || li.dataset.final) return;
    words.textContent += chunk;
    li.scrollIntoView({block: "nearest"});
  }
}

function watchRoom(session) {
  const {LK, room} = session;
  const E = LK.RoomEvent;
  const mine = (handler) => (...args) => { if (call === session) handler(...args); };
  room.registerTextStreamHandler(TRANSCRIPTION_TOPIC, (reader, participantInfo) => {
    onTranscription(session, reader, participantInfo && participantInfo.identity)
      .catch((err) => console.warn("transcription stream failed", err));
  });
  room.registerTextStreamHandler(EVENTS_TOPIC, async (reader) => {
    let event;
    try { event = JSON.parse(await reader.readAll()); } catch { return; }
    if (call === session) showAgentEnding(event);
  });
  room.on(E.TrackSubscribed, mine((track) => {
    if (track.kind === LK.Track.Kind.Audio) track.attach(ui.audio);
  }));
  room.on(E.TrackUnsubscribed, mine((track) => {
    if (track.kind === LK.Track.Kind.Audio) track.detach(ui.audio);
  }));
  room.on(E.AudioPlaybackStatusChanged, mine(() => { ui.enableAudio.hidden = room.canPlaybackAudio; }));
  room.on(E.ParticipantConnected, mine(() => showLiveKitAgent(session)));
  room.on(E.ParticipantDisconnected, mine(() => showLiveKitAgent(session)));
  room.on(E.ParticipantAttributesChanged, mine(() => showLiveKitAgent(session)));
  room.on(E.Reconnecting, mine(() => setStatus("Reconnecting…")));
  room.on(E.Reconnected, mine(() => showLiveKitAgent(session)));
  // Before the join completes, connectLiveKit's own catch explains the failure.
  room.on(E.Disconnected, mine((reason) => { if (session.joined) disconnect(describeDisconnect(LK, reason)); }));
}

async function connectLiveKit() {
  showError("");
  const url = ui.lkUrl.value.trim();
  const token = ui.lkToken.value.trim();
  const problem = liveKitInputProblem(url, token);
  if (problem) { showError(problem); return; }
  ui.connect.disabled = true;
  setModeTabsEnabled(false);
  const fail = (message) => {
    showError(message);
    setStatus("Not connected");
    ui.connect.disabled = false;
    setModeTabsEnabled(true);
  };
  let LK;
  try {
    setStatus("Loading the LiveKit client…");
    LK = await loadLiveKit();
  } catch (err) {
    fail(err.message);
    return;
  }
  setStatus("Asking for the microphone…");
  let stream;
  try {
    stream = await openMicrophone();
  } catch (err) {
    fail(err.message);
    return;
  }
  const room = new LK.Room({adaptiveStream: false, dynacast: false});
  const session = {kind: "livekit", LK, room, stream, timers: [], segments: new Map(), joined: false};
  call = session;
  session.audioContext = startLevelMeter(stream);
  watchRoom(session);
  setStatus("Connecting to LiveKit…");
  try {
    await room.connect(url, token, {autoSubscribe: true});
    if (call !== session) return;
    localStorage.setItem(URL_KEY, url);
    const publication = await room.localParticipant.publishTrack(stream.getAudioTracks()[0], {
      source: LK.Track.Source.Microphone, name: "microphone",
    });
    if (call !== session) return;
    session.joined = true;
    session.timers.push(setInterval(async () => {
      const track = publication.track;
      const rtt = track ? rttOf(await track.getRTCStatsReport().catch(() => null)) : null;
      if (call === session) showRtt(rtt);
    }, 1000));
    room.startAudio().catch(() => {});
    ui.enableAudio.hidden = room.canPlaybackAudio;
    ui.connect.textContent = "Disconnect";
    ui.connect.disabled = false;
    showLiveKitAgent(session);
  } catch (err) {
    if (call === session) disconnect("Not connected");
    showError(describeLiveKitError(LK, err, url));
  }
}

ui.enableAudio.addEventListener("click", () => {
  if (call && call.kind === "livekit") {
    call.room.startAudio().then(() => { ui.enableAudio.hidden = call === null || call.room.canPlaybackAudio; })
      .catch(() => {});
  }
});

document.body.dataset.mode = mode;
checkAccess();
loadLiveKitConfig();
if (location.hash === "#livekit") selectMode("livekit");
