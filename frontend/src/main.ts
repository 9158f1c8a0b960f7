// Entry point of the chat page (templates/chat/index.html): boot data comes from a json_script.
import { mount } from "./chat/app";

if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", mount);
else mount();
