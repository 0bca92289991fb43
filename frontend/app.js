// The direct (aiortc) call page: one RTCPeerConnection, a mic track, and an
// "events" data channel carrying server events to the page and settings back.
"use strict";

const $ = (id) => document.getElementById(id);
const ui = {
  connect: $("connect"), status: $("status"), error: $("error"), state: $("agent-state"),
  level: $("level"), turn: $("fig-turn"), barge: $("fig-barge"), rtt: $("fig-rtt"),
  overlap: $("overlap-policy"), instructions: $("instructions"), transcript: $("transcript"),
  audio: $("agent-audio"),
};

let call = null; // {pc, channel, stream, audioContext, timers}

function showError(text) {
  ui.error.textContent = text;
  ui.error.hidden = !text;
}

function setStatus(text) { ui.status.textContent = text; }

function setAgentState(state) {
  ui.state.textContent = state;
  ui.state.className = "state " + state;
}

function formatMs(value) { return value == null ? "–" : Math.round(value) + " ms"; }

// ---- transcript ----

const agentLines = new Map(); // response_id -> <li>

function addLine(who, text) {
  const li = document.createElement("li");
  li.className = who;
  li.textContent = text;
  ui.transcript.appendChild(li);
  li.scrollIntoView({block: "nearest"});
  return li;
}

function agentLine(responseId) {
  let li = agentLines.get(responseId);
  if (!li) {
    li = addLine("agent", "");
    agentLines.set(responseId, li);
  }
  return li;
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
        agentLines.get(event.response_id).classList.add("interrupted");
      }
      break;
    case "metrics":
      ui.turn.textContent = formatMs(event.latency.turn_ms.last);
      ui.barge.textContent = formatMs(event.latency.barge_in_ms.last);
      break;
    case "session.closed": setStatus("The agent ended the call"); break;
    case "error": showError(`Agent error (${event.error.code}): ${event.error.message}`); break;
  }
}

function sendSettings() {
  if (!call || call.channel.readyState !== "open") return;
  const session = {overlap_policy: ui.overlap.value};
  if (ui.instructions.value.trim()) session.instructions = ui.instructions.value.trim();
  call.channel.send(JSON.stringify({type: "session.update", session}));
}

// ---- microphone ----

async function openMicrophone() {
  if (!navigator.mediaDevices || !navigator.mediaDevices.getUserMedia) {
    throw new Error("This page needs a secure context (https or localhost) to use the microphone.");
  }
  try {
    return await navigator.mediaDevices.getUserMedia({
      audio: {echoCancellation: true, noiseSuppression: true, autoGainControl: true},
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
  const stats = await pc.getStats();
  let rtt = null;
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
  setStatus("Asking for the microphone…");
  let stream;
  try {
    stream = await openMicrophone();
  } catch (err) {
    showError(err.message);
    setStatus("Not connected");
    ui.connect.disabled = false;
    return;
  }
  const pc = new RTCPeerConnection({iceServers: []});
  const channel = pc.createDataChannel("events");
  call = {pc, channel, stream, audioContext: startLevelMeter(stream), timers: []};
  stream.getAudioTracks().forEach((track) => pc.addTrack(track, stream));
  pc.ontrack = (event) => { ui.audio.srcObject = event.streams[0] || new MediaStream([event.track]); };
  channel.onmessage = onServerMessage;
  channel.onopen = () => { setStatus("Connected"); setAgentState("listening"); sendSettings(); };
  channel.onclose = () => { if (call && call.pc === pc) disconnect("Disconnected"); };
  pc.onconnectionstatechange = () => {
    if (pc.connectionState === "failed") disconnect("The connection failed");
  };
  call.timers.push(setInterval(async () => { ui.rtt.textContent = formatMs(await readRtt(pc)); }, 1000));

  setStatus("Connecting…");
  try {
    await pc.setLocalDescription(await pc.createOffer());
    await iceGatheringComplete(pc, 2000);
    const response = await fetch("/api/offer", {
      method: "POST",
      headers: {"Content-Type": "application/json"},
      body: JSON.stringify({sdp: pc.localDescription.sdp, type: pc.localDescription.type}),
    });
    const answer = await response.json();
    if (!response.ok) throw new Error(answer.error ? answer.error.message : response.statusText);
    await pc.setRemoteDescription({sdp: answer.sdp, type: answer.type});
    ui.connect.textContent = "Disconnect";
    ui.connect.disabled = false;
  } catch (err) {
    disconnect("Not connected");
    showError("Could not connect: " + err.message);
  }
}

function disconnect(statusText) {
  if (!call) return;
  const {pc, stream, audioContext, timers} = call;
  call = null;
  timers.forEach(clearInterval);
  pc.close();
  stream.getTracks().forEach((track) => track.stop());
  audioContext.close();
  ui.level.style.width = "0%";
  ui.audio.srcObject = null;
  setAgentState("idle");
  setStatus(statusText);
  ui.connect.textContent = "Connect";
  ui.connect.disabled = false;
}

ui.connect.addEventListener("click", () => (call ? disconnect("Not connected") : connect()));
ui.overlap.addEventListener("change", sendSettings);
ui.instructions.addEventListener("change", sendSettings);
